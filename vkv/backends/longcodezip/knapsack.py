"""Exact 0/1 knapsack by dynamic programming over integer weights, vectorised with numpy.

When the capacity is large the weights are bucketed: every weight is rounded *up* to a multiple of
the bucket, so any selection feasible in buckets is feasible in tokens, and the DP stays at most
`resolution` cells wide; the tokens the rounding leaves unused are then filled with the remaining
items by value per token. With bucket 1 the answer is exactly optimal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class KnapsackSolution:
    chosen: list[int]  # item indices, ascending
    value: float
    weight: int
    bucket: int  # tokens per DP cell (1 = exact)


def solve_knapsack(values, weights, capacity: int, resolution: int = 4096) -> KnapsackSolution:
    """Maximise the total value of chosen items whose weights sum to at most `capacity`."""
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.int64)
    if np.any(weights < 0):
        raise ValueError("knapsack weights must be non-negative")
    capacity = int(max(capacity, 0))
    bucket = max(1, math.ceil(capacity / resolution))
    cells = capacity // bucket
    scaled = -(-weights // bucket)  # ceiling division keeps every bucketed solution feasible
    best = np.zeros(cells + 1)  # best[c]: best value with bucketed weight ≤ c
    took = np.zeros((len(values), cells + 1), dtype=bool)
    for i, (value, weight) in enumerate(zip(values, scaled)):
        if value <= 0 or weight > cells:
            continue  # never worth taking, or never fits
        candidate = np.full(cells + 1, -np.inf)
        candidate[weight:] = best[: cells + 1 - weight] + value
        took[i] = candidate > best
        best = np.where(took[i], candidate, best)
    chosen = []
    cell = cells
    for i in range(len(values) - 1, -1, -1):
        if took[i, cell]:
            chosen.append(i)
            cell -= int(scaled[i])
    chosen.reverse()
    if bucket > 1:
        chosen = _fill(values, weights, capacity, chosen)
    return KnapsackSolution(chosen, float(values[chosen].sum()), int(weights[chosen].sum()), bucket)


def _fill(values: np.ndarray, weights: np.ndarray, capacity: int, chosen: list[int]) -> list[int]:
    """Add left-out items, best value per token first, while they fit in the true token capacity."""
    room = capacity - int(weights[chosen].sum())
    taken = set(chosen)
    density = values / np.maximum(weights, 1)
    for i in np.argsort(-density, kind="stable").tolist():
        if i not in taken and values[i] > 0 and weights[i] <= room:
            taken.add(i)
            room -= int(weights[i])
    return sorted(taken)
