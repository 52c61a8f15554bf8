from dataclasses import dataclass

import torch

from vkv.methods.base import SpanWork
from vkv.methods.eviction import EvictionMethod


@dataclass
class KeyNorm(EvictionMethod):
    """Keep the tokens whose keys have the lowest L2 norm (averaged over layers and KV heads)."""

    name = "knorm"

    def select(self, work: SpanWork, budget: int) -> torch.Tensor:
        norms = work.acts.keys_pre_rope.norm(dim=-1).mean(dim=(0, 1))  # rotation keeps norms: pre = post
        return torch.topk(-norms, budget).indices
