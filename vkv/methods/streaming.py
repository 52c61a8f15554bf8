import torch

from ..cache import Segment
from .base import Method, SpanWork


class Streaming(Method):
    """StreamingLLM: a few attention-sink tokens at the start of the span plus the most recent window."""

    name = "streaming"
    options_taken = ("sinks",)

    def compress(self, work: SpanWork, ratio: float) -> Segment:
        k = work.budget(ratio)
        sinks = min(int(self.options.get("sinks", 4)), k // 4)
        recent = torch.arange(work.span_length - (k - sinks), work.span_length)
        return work.keep(torch.cat([torch.arange(sinks), recent]))
