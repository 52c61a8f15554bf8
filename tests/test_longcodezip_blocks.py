"""Perplexity-spike block boundaries."""

from __future__ import annotations

import numpy as np

from vkv.backends.longcodezip.blocks import spike_lines, split_blocks


def test_a_clear_spike_starts_a_block():
    nll = np.array([1.0, 1.1, 0.9, 6.0, 1.0, 1.2, 1.0, 5.5, 0.8])
    assert spike_lines(nll, alpha=0.5) == [3, 7]
    assert split_blocks(nll, np.ones(9, dtype=bool), alpha=0.5) == [(0, 3), (3, 7), (7, 9)]


def test_threshold_is_alpha_times_sigma_of_the_differences():
    nll = np.array([1.0, 2.0, 1.0, 1.0, 1.0])  # a rise of 1 over both neighbours
    sigma = np.diff(nll).std()
    assert spike_lines(nll, alpha=0.99 / sigma) == [1]
    assert spike_lines(nll, alpha=1.01 / sigma) == []


def test_a_rise_without_a_fall_is_not_a_spike():
    nll = np.array([1.0, 2.0, 4.0, 5.0, 9.0])
    assert spike_lines(nll, alpha=0.0) == [4]  # only the last line: it has no right neighbour to fall to
    assert spike_lines(np.array([3.0, 1.0, 1.0, 1.0]), alpha=0.1) == []  # the first line never counts


def test_unscored_lines_are_skipped_when_finding_neighbours():
    nll = np.array([1.0, np.nan, 1.0, 6.0, np.nan, 1.0, 1.1])
    assert spike_lines(nll, alpha=0.5) == [3]


def test_flat_or_short_input_has_no_spikes():
    assert spike_lines(np.array([2.0, 2.0, 2.0, 2.0]), alpha=0.5) == []
    assert spike_lines(np.array([1.0, 9.0]), alpha=0.5) == []
    assert split_blocks(np.array([]), np.array([], dtype=bool), alpha=0.5) == []


def test_a_spike_inside_a_statement_moves_back_to_where_the_statement_starts():
    nll = np.array([1.0, 1.0, 1.0, 7.0, 1.0, 1.0])
    can_start = np.array([True, True, True, False, True, True])  # line 3 continues line 2
    assert split_blocks(nll, can_start, alpha=0.5) == [(0, 2), (2, 6)]
    nowhere = np.array([True, False, False, False, False, False])
    assert split_blocks(nll, nowhere, alpha=0.5) == [(0, 6)]
