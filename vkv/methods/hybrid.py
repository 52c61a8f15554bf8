from dataclasses import dataclass
from typing import ClassVar

from vkv.compress.config import CompressConfig
from vkv.compress.hybrid import HybridConfig, HybridRecipe, hybrid_segment
from vkv.compress.reconstruction import reconstruction_scores
from vkv.compress.work import SpanWork
from vkv.kv.segment import Segment
from vkv.methods.base import BudgetMethod


@dataclass
class Hybrid(BudgetMethod):
    """Per-turn verbatim: a share of the span's tokens (by V-uniqueness by default), the same for every head, kept
    verbatim at their original positions, the rest compressed into virtual tokens; both together meet the ratio's
    entry budget."""

    name = "hybrid"
    reports_steps = True
    recipe_class: ClassVar[type] = HybridRecipe
    recipe: HybridRecipe | None = None  # None: the defaults
    verbatim: HybridConfig | None = None  # None: the defaults

    def settings(self) -> tuple[CompressConfig, HybridConfig]:
        return HybridRecipe.of(self.recipe).validate(), (self.verbatim or HybridConfig()).validate()

    def compress_to(self, work: SpanWork, budget: int, on_step=None) -> Segment:
        compress, verbatim = self.settings()
        span_kv = work.kv.slice(work.start - work.kv_start, work.end - work.kv_start)
        return hybrid_segment(
            work.lm,
            work.ids,
            work.acts,
            span_kv,
            work.prefix(),
            budget,
            compress,
            verbatim,
            work.message_starts,
            on_step,
            reconstruction_scores(work) if compress.needs_reconstruction else None,
        )

    def config(self) -> dict:
        compress, verbatim = self.settings()
        return compress.to_dict() | {"verbatim": verbatim.to_dict()}
