import torch

from ..cache import Segment
from .base import Method, SpanWork


class Truncate(Method):
    """Keep the most recent span tokens' K/V at their positions (what agents do when they drop old turns)."""

    name = "truncate"

    def compress(self, work: SpanWork, ratio: float) -> Segment:
        k = work.budget(ratio)
        return work.keep(torch.arange(work.span_length - k, work.span_length))
