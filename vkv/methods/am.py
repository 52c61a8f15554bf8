"""Attention matching (Zweiger et al. 2026) as a method: the span's compaction (compress/attention_matching.py) kept
as each head's entries."""

from __future__ import annotations

from dataclasses import dataclass

from vkv.compress.attention_matching import AttentionMatchingFit
from vkv.compress.history import HistoryWork
from vkv.compress.work import SpanWork
from vkv.kv.segment import Segment
from vkv.methods.base import PerTurnMethod


@dataclass
class AttentionMatching(PerTurnMethod, AttentionMatchingFit):
    """Zweiger et al. 2026, question-free, the reference's fast headline variant by default: reference queries from
    the model reading the span out again (all of them up to a cap), each layer's taken with the earlier layers
    already compacted; keys by RMS attention; β by the reference's bounded NNLS; values by least squares; one budget
    over every layer and head by the keys' scores, no head above 0.75 of the span."""

    name = "am"

    def compress_to(self, work: SpanWork, budget: int, on_step=None) -> Segment:
        result, count = self.compaction(work, budget)
        layers, kv_heads = work.lm.cache_shape[:2]
        shape = (layers, kv_heads, -1)
        return work.keep_per_head(
            result.index.reshape(shape),
            result.values.reshape(layers, kv_heads, -1, result.values.shape[-1]),
            result.bias.reshape(shape),
            None if bool(result.real.all()) else result.real.reshape(shape),
            reference_queries=count,
        )

    def compact_history(self, work: HistoryWork, entries: int) -> Segment:
        """Refits its own fitted entries (`AttentionMatchingFit.refit_history`)."""
        return self.refit_history(work, entries)
