"""KVzip (Kim et al. 2025), question-free: an entry's importance is the most attention it receives while the model
reads the span out again after "repeat the previous context"; the best ones are kept under one threshold over every
layer and KV head, as the paper and kvpress's KVzipPress allocate (`head_budget` global; adaptive is AdaKV's split
within each layer, every layer the same total). Its scores differ from the reference code's in how the pass is
normalised (`normalise`: context by default; chunk is the reference's, see compress/reconstruction.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.head_budget import HeadBudget, head_budget_setting
from vkv.compress.history import HistoryWork, best_entries
from vkv.compress.reconstruction import chunk_setting, normalisation_setting, reconstruction_scores
from vkv.compress.work import SpanWork
from vkv.kv.segment import Segment
from vkv.methods.eviction import ScorerMethod


@dataclass
class KVzip(ScorerMethod):
    name = "kvzip"
    head_budget: HeadBudget = head_budget_setting(HeadBudget.GLOBAL)
    chunk: int = chunk_setting()
    normalise: str = normalisation_setting()

    def score(self, work: SpanWork, budget: int) -> torch.Tensor:
        return reconstruction_scores(work, self.chunk, self.normalise)  # [layers, kv_heads, n]

    def compact_history(self, work: HistoryWork, entries: int) -> Segment:
        """Re-scores the history's entries by a read-out of its text on top of them (the pass's own scores, over the
        whole context) and keeps the best, `entries` per head on average split by its head budget."""
        scores = reconstruction_scores(work, self.chunk, "context")
        return work.history.keep(*best_entries(scores, work.history.real, entries, self.head_budget))
