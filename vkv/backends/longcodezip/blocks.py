"""Fine-stage blocks: a chunk's lines cut wherever the line perplexity spikes.

A line is a spike when its NLL rises above *both* neighbours by at least α·σ, σ being the standard
deviation of the differences between consecutive line NLLs (the quantity the test compares, so the
threshold is on the same scale). A spike starts a new block. Blank lines and lines without scored
tokens carry no signal and are skipped when finding neighbours.
"""

from __future__ import annotations

import numpy as np


def spike_lines(line_nll: np.ndarray, alpha: float) -> list[int]:
    """Indices of lines whose NLL exceeds each scored neighbour by ≥ α·σ(differences)."""
    scored = np.flatnonzero(np.isfinite(line_nll))
    if len(scored) < 3:
        return []
    values = line_nll[scored]
    diffs = np.diff(values)
    sigma = float(diffs.std())
    if sigma == 0.0:
        return []
    threshold = alpha * sigma
    rise_from_left = np.concatenate([[np.inf], diffs])  # values[k] - values[k-1]; none before the first
    rise_over_right = np.concatenate([-diffs, [np.inf]])  # values[k] - values[k+1]; none after the last
    spikes = (rise_from_left >= threshold) & (rise_over_right >= threshold)
    spikes[0] = False  # the first line starts a block anyway
    return scored[spikes].tolist()


def split_blocks(line_nll: np.ndarray, can_start: np.ndarray, alpha: float) -> list[tuple[int, int]]:
    """Blocks [start, end) of relative line indices; each spike starts one, moved back to a line
    where a block may start (`can_start`, false inside a multi-line statement)."""
    count = len(line_nll)
    if count == 0:
        return []
    starts = [0]
    for line in spike_lines(line_nll, alpha):
        while line > starts[-1] and not can_start[line]:
            line -= 1
        if line > starts[-1]:
            starts.append(line)
    return [(s, e) for s, e in zip(starts, starts[1:] + [count])]
