from dataclasses import dataclass

import torch

from vkv.compress.work import SpanWork
from vkv.methods.eviction import EvictionMethod


@dataclass
class Truncate(EvictionMethod):
    """Keep the most recent span tokens' K/V at their positions (what agents do when they drop old turns)."""

    name = "truncate"

    def select(self, work: SpanWork, budget: int) -> torch.Tensor:
        return torch.arange(work.span_length - budget, work.span_length)
