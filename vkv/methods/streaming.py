from dataclasses import dataclass

import torch

from vkv.compress.work import SpanWork
from vkv.methods.eviction import EvictionMethod
from vkv.settings import setting


@dataclass
class Streaming(EvictionMethod):
    """StreamingLLM: a few attention-sink tokens at the start of the span plus the most recent window."""

    name = "streaming"
    sinks: int = setting(4, "attention-sink tokens kept at the start of the span", minimum=0)

    def select(self, work: SpanWork, budget: int) -> torch.Tensor:
        sinks = min(int(self.sinks), budget // 4)
        recent = torch.arange(work.span_length - (budget - sinks), work.span_length)
        return torch.cat([torch.arange(sinks), recent])
