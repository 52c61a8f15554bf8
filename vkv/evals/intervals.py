"""95 % intervals for eval results by a bootstrap that resamples windows, and paired differences between methods.

Questions asked of one compressed window share that compression (and the window's difficulty), so they are not
independent draws: the bootstrap resamples whole windows with replacement (a cluster bootstrap) and recomputes the
mean over all questions of the drawn windows. A paired difference compares two methods question by question on the
questions both were scored on and resamples the same windows for both, so what they share cancels.

Inputs are plain mappings `{(window, question id): value}`; seeds of one method on one question are averaged
before they get here (a question is one observation, however many seeds ran it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import numpy as np

RESAMPLES = 4000
LEVEL = 0.95

QuestionKey = tuple[Hashable, Hashable]  # (window, question id)


@dataclass(frozen=True)
class Interval:
    """A pooled mean over questions and its percentile-bootstrap interval."""

    mean: float
    low: float
    high: float
    questions: int
    windows: int

    @property
    def separable(self) -> bool:
        """The interval excludes 0 (meaningful for a difference)."""
        return self.low > 0 or self.high < 0

    @property
    def half_width(self) -> float:
        return max(self.mean - self.low, self.high - self.mean)


def window_bootstrap(
    values: Mapping[QuestionKey, float], resamples: int = RESAMPLES, level: float = LEVEL, seed: int = 0
) -> Interval | None:
    """Mean of `values` over questions, with an interval from resampling windows; None when there are none."""
    by_window: dict[Hashable, list[float]] = defaultdict(list)
    for (window, _), value in values.items():
        by_window[window].append(float(value))
    if not by_window:
        return None
    windows = sorted(by_window, key=str)  # a fixed order, so the same seed draws the same windows
    sums = np.array([sum(by_window[w]) for w in windows])
    counts = np.array([len(by_window[w]) for w in windows])
    draws = np.random.default_rng(seed).integers(0, len(windows), size=(resamples, len(windows)))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    tail = (1.0 - level) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    mean = float(sums.sum() / counts.sum())
    # The pooled mean lies inside its own interval; clamp the last ulp that quantile interpolation can lose.
    return Interval(mean, min(float(low), mean), max(float(high), mean), int(counts.sum()), len(windows))


def paired_difference(
    method: Mapping[QuestionKey, float],
    reference: Mapping[QuestionKey, float],
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = 0,
) -> Interval | None:
    """method − reference on the questions both have, with a window-bootstrap interval; None if none are shared."""
    shared = method.keys() & reference.keys()
    return window_bootstrap({k: method[k] - reference[k] for k in shared}, resamples, level, seed)
