import torch

from vkv.methods.base import SpanWork
from vkv.methods.eviction import EvictionMethod


class Streaming(EvictionMethod):
    """StreamingLLM: a few attention-sink tokens at the start of the span plus the most recent window."""

    name = "streaming"
    options_taken = ("sinks", *EvictionMethod.options_taken)

    def select(self, work: SpanWork, budget: int) -> torch.Tensor:
        sinks = min(int(self.options.get("sinks", 4)), budget // 4)
        recent = torch.arange(work.span_length - (budget - sinks), work.span_length)
        return torch.cat([torch.arange(sinks), recent])
