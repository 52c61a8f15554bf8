from dataclasses import dataclass

import torch

from vkv.compress.head_budget import HeadBudget, head_budget_setting
from vkv.compress.history import HistoryWork, best_entries
from vkv.compress.work import SpanWork
from vkv.kv.segment import Segment
from vkv.methods.eviction import ScorerMethod
from vkv.settings import setting


@dataclass
class SnapKV(ScorerMethod):
    """SnapKV, question-agnostic: the last tokens of the span are the observation window, always kept; the rest are
    scored by the window's attention, pooled over neighbours. The defaults are kvpress's SnapKVPress: a 64-token
    window and each KV head its own best entries (`shared`, the same tokens in every head, was not separable from
    it on the dev split and trailed it on the cross-checked test windows, evals/RESULTS.md)."""

    name = "snapkv"
    head_budget: HeadBudget = head_budget_setting(HeadBudget.UNIFORM)
    window: int = setting(
        64, "the observation window: the span's last tokens, whose attention scores the rest", minimum=1
    )
    kernel: int = setting(5, "scores are pooled over this many neighbours (odd)", minimum=1)

    def score(self, work: SpanWork, budget: int) -> torch.Tensor:
        window = max(1, min(int(self.window), budget // 2))
        observed_end = work.span_length - window
        layers, kv_heads = work.acts.values.shape[:2]
        if observed_end <= 0 or budget <= window:  # too short to observe: keep the most recent
            return torch.arange(work.span_length).float().expand(layers, kv_heads, -1)
        keys, queries = (work.start, work.start + observed_end), (work.end - window, work.end)
        attn = work.reuse(("attention", keys, queries), lambda: work.attention_between(keys, queries))
        kernel = int(self.kernel)
        pooled = torch.nn.functional.avg_pool1d(attn.reshape(-1, 1, observed_end), kernel, 1, kernel // 2)
        always = torch.full((layers, kv_heads, window), float("inf"))
        return torch.cat([pooled.reshape(layers, kv_heads, -1)[..., :observed_end], always], dim=-1)

    def compact_history(self, work: HistoryWork, entries: int) -> Segment:
        """Re-scores the history's entries by the attention of the newest chunk's last `window` tokens (the
        observation window as it stands now; no pooling, since a head's neighbouring slots need not be neighbouring
        tokens) and keeps the best, `entries` per head on average split by its head budget."""
        scores = work.recent_attention(min(int(self.window), work.recent.acts.length))
        return work.history.keep(*best_entries(scores, work.history.real, entries, self.head_budget))
