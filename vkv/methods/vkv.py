from dataclasses import dataclass

from vkv.compress.config import CompressConfig
from vkv.compress.single import virtual_segment
from vkv.kv.segment import Segment
from vkv.methods.base import Method, SpanWork


@dataclass
class VirtualTokens(Method):
    """vkv: virtual tokens optimised so their per-layer V match surprisal-pooled targets."""

    name = "vkv"
    reports_steps = True
    recipe: CompressConfig | None = None  # None: the defaults

    def settings(self, ratio: float) -> CompressConfig:
        config = self.recipe or CompressConfig()
        return CompressConfig.from_dict({**config.to_dict(), "ratio": ratio})

    @property
    def question_aware(self) -> bool:
        return (self.recipe or CompressConfig()).pooling == "attention"

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> Segment:
        prefix = work.kv.slice(0, work.start)
        return virtual_segment(
            work.lm,
            work.ids,
            work.acts,
            prefix,
            self.settings(ratio),
            work.message_starts,
            work.attention,
            on_step,
            teacher=work.kv,
        )

    def config(self) -> dict:
        return self.settings(1.0).to_dict() | {"ratio": None}


@dataclass
class MeanPool(VirtualTokens):
    """The virtual tokens' pooled initial embeddings, not optimised: what optimisation adds over pooling."""

    name = "meanpool"
    reports_steps = False  # it takes no optimisation step, so no progress bar counts them

    def settings(self, ratio: float) -> CompressConfig:
        config = super().settings(ratio)
        config.optim.steps = 0
        return config
