import torch

from ..attention import attention_to_span
from ..cache import Segment
from .base import Method, SpanWork


class SnapKV(Method):
    """SnapKV, question-agnostic: the last tokens of the span are the observation window; the rest are scored
    by the window's attention (pooled over neighbours) and the top ones kept. Selection is per token, shared
    by all layers and heads, so every kept entry has one position."""

    name = "snapkv"
    options_taken = ("window", "kernel")

    def compress(self, work: SpanWork, ratio: float) -> Segment:
        k = work.budget(ratio)
        window = max(1, min(int(self.options.get("window", 32)), k // 2))
        kernel = int(self.options.get("kernel", 5))
        observed_end = work.span_length - window
        if observed_end <= 0 or k <= window:
            return work.keep(torch.arange(work.span_length - k, work.span_length))
        attn = attention_to_span(work.lm, work.ids[: work.end], (work.start, work.start + observed_end),
                                 (work.end - window, work.end))
        scores = attn.mean(dim=(0, 1))
        scores = torch.nn.functional.avg_pool1d(scores[None, None], kernel, stride=1, padding=kernel // 2)[0, 0]
        chosen = torch.topk(scores[:observed_end], k - window).indices
        return work.keep(torch.cat([chosen, torch.arange(observed_end, work.span_length)]))
