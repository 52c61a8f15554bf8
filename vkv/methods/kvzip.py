"""KVzip (Kim et al. 2025), question-free: an entry's importance is the most attention it receives while the model
reads the span out again after "repeat the previous context"; the best ones are kept, per KV head or per token."""

from __future__ import annotations

from dataclasses import dataclass

from vkv.compress.reconstruction import ReconstructionPass
from vkv.errors import VkvError
from vkv.kv.segment import Segment
from vkv.methods.base import Method, SpanWork

GRANULARITIES = ("head", "token")


@dataclass
class KVzip(Method):
    name = "kvzip"
    granularity: str = "head"  # each KV head keeps its own best entries; "token": the same tokens for every head

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> Segment:
        scores = ReconstructionPass.run(work.lm, work.ids, work.start, work.end).scores(work.lm)  # [L, H, n]
        budget = work.budget(ratio)
        if self.granularity == "token":
            return work.keep(scores.amax(dim=(0, 1)).topk(budget).indices)
        if self.granularity != "head":
            raise VkvError(
                f"kvzip: field granularity: unknown value '{self.granularity}'; choose one of {', '.join(GRANULARITIES)}"
            )
        return work.keep_per_head(scores.topk(budget, dim=-1).indices.sort(-1).values)
