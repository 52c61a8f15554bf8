from dataclasses import dataclass

import torch

from vkv.methods.base import SpanWork
from vkv.methods.eviction import ScorerMethod


@dataclass
class KeyNorm(ScorerMethod):
    """Keep the entries whose keys have the lowest L2 norm (by default averaged over layers and KV heads)."""

    name = "knorm"

    def score(self, work: SpanWork, budget: int) -> torch.Tensor:
        return -work.acts.keys_pre_rope.norm(dim=-1).float()  # rotation keeps norms: pre-RoPE = post-RoPE
