"""KVzip (Kim et al. 2025), question-free: an entry's importance is the most attention it receives while the model
reads the span out again after "repeat the previous context"; the best ones are kept, by default per KV head."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.reconstruction import chunk_setting, reconstruction_scores
from vkv.methods.eviction import ScorerMethod
from vkv.methods.work import SpanWork


@dataclass
class KVzip(ScorerMethod):
    name = "kvzip"
    chunk: int = chunk_setting()

    def score(self, work: SpanWork, budget: int) -> torch.Tensor:
        return reconstruction_scores(work, self.chunk)  # [layers, kv_heads, n]
