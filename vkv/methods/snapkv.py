from dataclasses import dataclass

import torch

from vkv.methods.base import SpanWork
from vkv.methods.eviction import EvictionMethod


@dataclass
class SnapKV(EvictionMethod):
    """SnapKV, question-agnostic: the last tokens of the span are the observation window; the rest are scored
    by the window's attention (pooled over neighbours) and the top ones kept. Selection is per token, shared
    by all layers and heads, so every kept entry has one position."""

    name = "snapkv"
    window: int = 32  # the observation window: the span's last tokens, whose attention scores the rest
    kernel: int = 5  # scores are pooled over this many neighbours

    def select(self, work: SpanWork, budget: int) -> torch.Tensor:
        window = max(1, min(int(self.window), budget // 2))
        kernel = int(self.kernel)
        observed_end = work.span_length - window
        if observed_end <= 0 or budget <= window:
            return torch.arange(work.span_length - budget, work.span_length)
        attn = work.attention_between((work.start, work.start + observed_end), (work.end - window, work.end))
        scores = attn.mean(dim=(0, 1))
        scores = torch.nn.functional.avg_pool1d(scores[None, None], kernel, stride=1, padding=kernel // 2)[0, 0]
        chosen = torch.topk(scores[:observed_end], budget - window).indices
        return torch.cat([chosen, torch.arange(observed_end, work.span_length)])
