from dataclasses import dataclass

import torch

from vkv.compress.head_budget import HeadBudget, head_budget_setting
from vkv.compress.work import SpanWork
from vkv.methods.eviction import ScorerMethod


@dataclass
class KeyNorm(ScorerMethod):
    """Keep the entries whose keys have the lowest L2 norm (by default averaged over layers and KV heads)."""

    name = "knorm"
    # Key norms are not comparable across heads, so giving each head its own choice by them loses (evals/RESULTS.md,
    # "Head-wise budgets (dev, 3.2×)"): the same tokens in every head.
    head_budget: HeadBudget = head_budget_setting(HeadBudget.SHARED)

    def score(self, work: SpanWork, budget: int) -> torch.Tensor:
        return -work.acts.keys_pre_rope.norm(dim=-1).float()  # rotation keeps norms: pre-RoPE = post-RoPE
