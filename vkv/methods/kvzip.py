"""KVzip (Kim et al. 2025), question-free: an entry's importance is the most attention it receives while the model
reads the span out again after "repeat the previous context"; the best ones are kept, by default per KV head."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.reconstruction import ReconstructionPass, chunk_setting
from vkv.methods.eviction import ScorerMethod
from vkv.methods.work import SpanWork


@dataclass
class KVzip(ScorerMethod):
    name = "kvzip"
    chunk: int = chunk_setting()

    def score(self, work: SpanWork, budget: int) -> torch.Tensor:
        # [layers, kv_heads, n]; the pass does not depend on the budget, so runs at several ratios share it
        return work.reuse(
            ("reconstruction scores", self.chunk), lambda: ReconstructionPass.run(work, self.chunk, score=True).scores
        )
