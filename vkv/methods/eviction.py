"""Eviction methods: keep a budget of the span's own K/V entries at their original positions; only the choice of
entries differs, so a method is one `select` (the same tokens in every head) or one `score` (each layer and KV head
scored, so heads may keep different entries), and these base classes own the rest. The per-turn setting is
PerTurnMethod's (methods/turns.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.head_budget import HeadBudget, head_budget_setting, per_head_index
from vkv.compress.work import SpanWork
from vkv.kv.segment import Segment, mass_bias
from vkv.methods.base import PerTurnMethod
from vkv.settings import setting

MASS_RULES = ("none", "nearest")


def nearest_mass(kept: torch.Tensor, n: int) -> torch.Tensor:
    """Tokens each kept entry stands for `[t]` (kept: ascending span-relative indices): itself and every dropped
    token nearer to it than to any other kept one (ties go to the earlier); they sum to n."""
    distance = (torch.arange(n)[:, None] - kept[None, :]).abs()  # [n, t]
    return torch.bincount(distance.argmin(dim=1), minlength=len(kept)).float()


@dataclass
class EvictionMethod(PerTurnMethod):
    """A KV-eviction method: `select(work, budget)` returns the span-relative indices of the entries to keep."""

    mass: str = setting(
        "none",
        "nearest: bias each kept entry by the tokens it stands for, log(1 + the dropped tokens nearest to it), the "
        "lever proportional attention gives virtual tokens",
        MASS_RULES,
    )

    def select(self, work: SpanWork, budget: int) -> torch.Tensor:
        raise NotImplementedError

    def compress_to(self, work: SpanWork, budget: int, on_step=None) -> Segment:
        return self.keep(work, self.select(work, budget))

    def keep(self, work: SpanWork, index: torch.Tensor) -> Segment:
        segment = work.keep(index)
        if self.mass == "nearest":
            kept = segment.positions.long() - work.start
            segment.bias = mass_bias(nearest_mass(kept, work.span_length), *segment.keys.shape[:2])
        return segment


@dataclass
class ScorerMethod(EvictionMethod):
    """An eviction method that scores every entry per layer and KV head, `score(work, budget)` `[layers, kv_heads,
    n]` (higher: keep). `head_budget` decides who keeps what: `shared`, the tokens with the best mean score in
    every head; `uniform`, each head its own best `budget`; `adaptive`, AdaKV's split (compress/head_budget.py)."""

    head_budget: HeadBudget = head_budget_setting()

    def score(self, work: SpanWork, budget: int) -> torch.Tensor:
        raise NotImplementedError

    def select(self, work: SpanWork, budget: int) -> torch.Tensor:
        return self.score(work, budget).mean(dim=(0, 1)).topk(budget).indices

    def compress_to(self, work: SpanWork, budget: int, on_step=None) -> Segment:
        if not self.head_budget.per_head:
            return super().compress_to(work, budget)
        index, real = per_head_index(self.score(work, budget), budget, self.head_budget)
        bias = None
        if self.mass == "nearest":
            mass = torch.ones(index.shape)
            for layer, head in torch.cartesian_prod(torch.arange(index.shape[0]), torch.arange(index.shape[1])):
                count = int(real[layer, head].sum())
                mass[layer, head, :count] = nearest_mass(index[layer, head, :count], work.span_length)
            bias = mass.log()
        return work.keep_per_head(index, bias=bias, real=None if bool(real.all()) else real)
