from vkv.compress.config import CompressConfig
from vkv.compress.hybrid import HybridConfig, hybrid_segment
from vkv.kv.segment import Segment
from vkv.methods.base import Method, SpanWork


class Hybrid(Method):
    """A share of the span's tokens (default 15%, by V-uniqueness) kept verbatim at their original positions,
    the rest compressed into virtual tokens; both together meet the ratio's entry budget."""

    name = "hybrid"
    options_taken = ("compress", "verbatim")

    def settings(self) -> tuple[CompressConfig, HybridConfig]:
        verbatim = self.options.get("verbatim") or HybridConfig()
        return self.options.get("compress") or CompressConfig(), verbatim.validate()

    def compress(self, work: SpanWork, ratio: float) -> Segment:
        compress, verbatim = self.settings()
        prefix, span_kv = work.kv.slice(0, work.start), work.kv.slice(work.start, work.end)
        return hybrid_segment(
            work.lm, work.ids, work.acts, span_kv, prefix, work.budget(ratio), compress, verbatim, work.message_starts
        )

    def config(self) -> dict:
        compress, verbatim = self.settings()
        return compress.to_dict() | {"ratio": None, "verbatim": verbatim.to_dict()}
