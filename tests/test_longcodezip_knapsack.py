"""Exact knapsack against brute force, bucketed feasibility, and the budget-splitting helpers."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from vkv.backends.longcodezip.budget import greedy_select, retention_ratios
from vkv.backends.longcodezip.knapsack import solve_knapsack


def brute_force(values, weights, capacity) -> float:
    best = 0.0
    for mask in itertools.product([0, 1], repeat=len(values)):
        weight = sum(w for w, m in zip(weights, mask) if m)
        if weight <= capacity:
            best = max(best, sum(v for v, m in zip(values, mask) if m))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_knapsack_matches_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 10)
    values = [rng.uniform(-1.0, 10.0) for _ in range(n)]
    weights = [rng.randint(0, 30) for _ in range(n)]
    capacity = rng.randint(0, 80)
    solution = solve_knapsack(values, weights, capacity)
    assert solution.bucket == 1
    assert solution.weight <= capacity
    assert solution.weight == sum(weights[i] for i in solution.chosen)
    assert solution.value == pytest.approx(sum(values[i] for i in solution.chosen))
    assert solution.value == pytest.approx(brute_force(values, weights, capacity))


def test_bucketed_knapsack_never_exceeds_capacity_and_is_near_optimal():
    rng = np.random.default_rng(0)
    values = rng.uniform(0.1, 5.0, size=60)
    weights = rng.integers(50, 900, size=60)
    capacity = 12_345
    coarse = solve_knapsack(values, weights, capacity, resolution=64)
    exact = solve_knapsack(values, weights, capacity, resolution=capacity)
    assert coarse.bucket > 1 and exact.bucket == 1
    assert coarse.weight <= capacity and exact.weight <= capacity
    assert coarse.value <= exact.value + 1e-9
    assert coarse.value >= 0.9 * exact.value


def test_knapsack_edge_cases():
    assert solve_knapsack([], [], 10).chosen == []
    assert solve_knapsack([1.0], [5], 0).chosen == []
    assert solve_knapsack([1.0, 2.0], [0, 0], 0).chosen == [0, 1]  # free items are always worth taking
    assert solve_knapsack([-1.0], [1], 10).chosen == []  # a negative value is never taken
    with pytest.raises(ValueError):
        solve_knapsack([1.0], [-1], 10)


def test_greedy_skips_what_does_not_fit_and_keeps_order():
    scores = [0.1, 5.0, 3.0, 2.0]
    sizes = [10, 50, 60, 40]
    # 5.0 (50) fits, 3.0 (60) would overshoot 100 and is skipped, 2.0 (40) and 0.1 (10) still fit.
    assert greedy_select(scores, sizes, 100) == [0, 1, 3]
    assert greedy_select(scores, sizes, 99) == [1, 3]
    assert greedy_select(scores, sizes, 0) == []
    assert greedy_select(scores, sizes, 1000) == [0, 1, 2, 3]


def test_retention_ratios_hit_the_target_and_favour_high_scores():
    scores = [0.0, 1.0, 2.0, 4.0]
    sizes = [100, 100, 100, 100]
    ratios = retention_ratios(scores, sizes, target=200, beta=0.5)
    assert sum(r * s for r, s in zip(ratios, sizes)) == pytest.approx(200, abs=1e-6)
    assert ratios == sorted(ratios)
    assert all(0.0 <= r <= 1.0 for r in ratios)
    assert retention_ratios(scores, sizes, target=1000, beta=0.5) == [1.0] * 4
    assert retention_ratios(scores, sizes, target=0, beta=0.5) == [0.0] * 4
    flat = retention_ratios([1.0, 1.0], [50, 150], target=100, beta=0.5)
    assert flat[0] == pytest.approx(flat[1]) == pytest.approx(0.5)
