"""Splitting a token budget: greedy chunk selection (coarse) and adaptive per-chunk ratios (fine)."""

from __future__ import annotations

import numpy as np


def greedy_select(scores: list[float], sizes: list[int], budget: float) -> list[int]:
    """Chunks by descending score, each kept only if it still fits; returned in original order.

    A chunk that does not fit is skipped, never allowed to overshoot: a smaller one later may fit.
    """
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    kept, used = [], 0
    for i in order:
        if used + sizes[i] <= budget:
            kept.append(i)
            used += sizes[i]
    return sorted(kept)


def retention_ratios(scores: list[float], sizes: list[int], target: float, beta: float) -> list[float]:
    """The paper's biased retention ratio r_i = R·(1 + β·(2·n_i − 1)), n_i the min–max normalised
    score, clipped to [0, 1], with the common R found by bisection so that Σ r_i·size_i = target."""
    sizes_arr = np.asarray(sizes, dtype=np.float64)
    if len(sizes) == 0:
        return []
    if target >= sizes_arr.sum():
        return [1.0] * len(sizes)
    if target <= 0:
        return [0.0] * len(sizes)
    s = np.asarray(scores, dtype=np.float64)
    spread = s.max() - s.min()
    normalised = (s - s.min()) / spread if spread > 0 else np.full(len(s), 0.5)
    bias = np.maximum(1.0 + beta * (2.0 * normalised - 1.0), 0.0)

    def kept(r: float) -> float:
        return float((np.clip(r * bias, 0.0, 1.0) * sizes_arr).sum())

    low, high = 0.0, 1.0
    while kept(high) < target and high < 1e6:
        high *= 2.0
    for _ in range(60):
        mid = (low + high) / 2.0
        low, high = (mid, high) if kept(mid) < target else (low, mid)
    return np.clip(low * bias, 0.0, 1.0).tolist()
