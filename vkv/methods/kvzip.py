"""KVzip (Kim et al. 2025), question-free: an entry's importance is the most attention it receives while the model
reads the span out again after "repeat the previous context"; the best ones are kept, by default per KV head."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.reconstruction import ReconstructionPass
from vkv.methods.base import SpanWork
from vkv.methods.eviction import ScorerMethod


@dataclass
class KVzip(ScorerMethod):
    name = "kvzip"
    # AdaKV's split of the layer's budget over its KV heads; "uniform": each head its own best `budget`; "shared": the
    # same tokens in every head. Chosen on the dev split (evals/RESULTS.md, issue 18): adaptive beat uniform by +0.305
    # [+0.241, +0.371] retention at 3.2x.
    head_budget: str = "adaptive"

    def score(self, work: SpanWork, budget: int) -> torch.Tensor:
        return ReconstructionPass.run(work).scores(work.lm)  # [layers, kv_heads, n]
