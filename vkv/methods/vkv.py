from dataclasses import dataclass, replace
from typing import ClassVar

from vkv.compress.config import CompressConfig
from vkv.compress.head_hybrid import HeadSplit, Verbatim
from vkv.compress.reconstruction import reconstruction_scores
from vkv.compress.single import virtual_segment
from vkv.kv.segment import Segment
from vkv.methods.am import AttentionMatching
from vkv.methods.base import BudgetMethod
from vkv.methods.work import SpanWork


@dataclass
class VirtualTokens(BudgetMethod):
    """vkv: virtual tokens optimised so their per-layer V match surprisal-pooled targets."""

    name = "vkv"
    reports_steps = True
    recipe_class: ClassVar[type] = CompressConfig
    recipe: CompressConfig | None = None  # None: the defaults

    def settings(self) -> CompressConfig:
        return (self.recipe or CompressConfig()).validate()

    @property
    def question_aware(self) -> bool:
        return self.settings().pooling == "attention"

    def compress_to(self, work: SpanWork, budget: int, on_step=None) -> Segment:
        recipe = self.settings()
        verbatim = None
        if recipe.verbatim_source == "am":
            compaction, _ = AttentionMatching().compaction(work, HeadSplit.of(budget, recipe.verbatim_share).verbatim)
            verbatim = Verbatim.fitted(*work.span_kv(), compaction)
        return virtual_segment(
            work.lm,
            work.ids,
            work.acts,
            work.prefix(),
            recipe,
            budget,
            work.message_starts,
            work.attention,
            on_step,
            teacher=work.kv,
            token_scores=reconstruction_scores(work) if recipe.needs_reconstruction else None,
            verbatim=verbatim,
        )

    def config(self) -> dict:
        return self.settings().to_dict()


@dataclass
class MeanPool(VirtualTokens):
    """The virtual tokens' pooled initial embeddings, not optimised: what optimisation adds over pooling."""

    name = "meanpool"
    reports_steps = False  # it takes no optimisation step, so no progress bar counts them

    def settings(self) -> CompressConfig:
        recipe = super().settings()
        return replace(recipe, optim=replace(recipe.optim, steps=0))
