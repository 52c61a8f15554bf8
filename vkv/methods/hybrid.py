from dataclasses import dataclass

from vkv.compress.config import CompressConfig
from vkv.compress.hybrid import HybridConfig, hybrid_segment
from vkv.kv.segment import Segment
from vkv.methods.base import Method, SpanWork


@dataclass
class Hybrid(Method):
    """A share of the span's tokens (default 15%, by V-uniqueness) kept verbatim at their original positions,
    the rest compressed into virtual tokens; both together meet the ratio's entry budget."""

    name = "hybrid"
    reports_steps = True
    recipe: CompressConfig | None = None  # None: the defaults
    verbatim: HybridConfig | None = None  # None: the defaults

    def settings(self) -> tuple[CompressConfig, HybridConfig]:
        return self.recipe or CompressConfig(), (self.verbatim or HybridConfig()).validate()

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> Segment:
        compress, verbatim = self.settings()
        prefix, span_kv = work.kv.slice(0, work.start), work.kv.slice(work.start, work.end)
        return hybrid_segment(
            work.lm,
            work.ids,
            work.acts,
            span_kv,
            prefix,
            work.budget(ratio),
            compress,
            verbatim,
            work.message_starts,
            on_step,
        )

    def config(self) -> dict:
        compress, verbatim = self.settings()
        return compress.to_dict() | {"ratio": None, "verbatim": verbatim.to_dict()}
