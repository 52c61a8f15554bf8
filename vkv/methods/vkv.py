from dataclasses import dataclass, replace
from typing import ClassVar

from vkv.compress.config import CompressConfig
from vkv.compress.single import span_segment
from vkv.compress.work import SpanWork
from vkv.kv.segment import Segment
from vkv.methods.base import BudgetMethod


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
        return span_segment(work, self.settings(), budget, on_step)

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
