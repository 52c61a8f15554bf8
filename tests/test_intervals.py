"""The window bootstrap and paired differences: known answers, clustering, and coverage."""

import numpy as np
import pytest

from vkv.evals.intervals import paired_difference, window_bootstrap


def clustered(windows: int, per_window: int, seed: int, shift: float = 0.0) -> dict:
    """Retention-like values whose windows differ (a window effect) more than their questions do."""
    rng = np.random.default_rng(seed)
    values = {}
    for w in range(windows):
        effect = rng.normal(0, 0.3)
        for q in range(per_window):
            values[(f"w{w}", f"q{q}")] = 0.5 + effect + rng.normal(0, 0.1) + shift
    return values


def test_a_constant_method_has_a_zero_width_interval():
    values = {(f"w{w}", f"q{q}"): 0.5 for w in range(7) for q in range(w + 1)}
    ci = window_bootstrap(values)
    assert (ci.mean, ci.low, ci.high) == (0.5, 0.5, 0.5)
    assert (ci.questions, ci.windows) == (28, 7)


def test_identical_methods_differ_by_exactly_zero_and_are_not_separable():
    values = clustered(12, 5, seed=1)
    diff = paired_difference(values, dict(values))
    assert (diff.mean, diff.low, diff.high) == (0.0, 0.0, 0.0)
    assert not diff.separable


def test_a_shifted_copy_differs_by_the_shift_whatever_the_window_effects():
    values = clustered(12, 5, seed=2)
    diff = paired_difference(clustered(12, 5, seed=2, shift=0.07), values)
    assert diff.mean == pytest.approx(0.07) and diff.low == pytest.approx(0.07) and diff.high == pytest.approx(0.07)
    assert diff.separable and diff.questions == 60 and diff.windows == 12


def test_pairs_only_the_questions_both_methods_have():
    method = {("w0", "a"): 1.0, ("w0", "b"): 0.0, ("w1", "c"): 1.0}
    reference = {("w0", "a"): 0.0, ("w1", "c"): 0.5, ("w2", "d"): 0.0}
    diff = paired_difference(method, reference)
    assert diff.mean == pytest.approx(0.75) and diff.questions == 2 and diff.windows == 2
    assert paired_difference(method, {("w9", "z"): 0.0}) is None


def test_resamples_windows_not_questions():
    # One window of a single 0 and one of 99 ones: drawing the first window twice (1 in 4) gives a mean of 0, so
    # the lower end is 0. A bootstrap over questions would put it near 0.97.
    values = {("w0", "q"): 0.0, **{("w1", f"q{i}"): 1.0 for i in range(99)}}
    ci = window_bootstrap(values)
    assert ci.mean == pytest.approx(0.99) and ci.low == 0.0 and ci.high == 1.0


def test_intervals_cover_the_true_mean_about_95_percent_of_the_time():
    # 200 data sets of 30 windows with a window effect; the true mean is 0.5.
    covered = 0
    for seed in range(200):
        ci = window_bootstrap(clustered(30, 6, seed), resamples=1000)
        covered += ci.low <= 0.5 <= ci.high
    assert 0.88 <= covered / 200 <= 0.99


def test_is_deterministic_for_a_seed():
    values = clustered(10, 4, seed=3)
    assert window_bootstrap(values, seed=5) == window_bootstrap(values, seed=5)
    assert window_bootstrap({}) is None
