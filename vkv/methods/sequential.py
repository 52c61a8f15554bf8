from dataclasses import dataclass

from vkv.compress.autoratio import AutoRatioConfig
from vkv.compress.config import CompressConfig
from vkv.compress.hybrid import HybridConfig
from vkv.compress.sequential import FullHistory, MultiTurnConfig, compress_turns, message_turns
from vkv.kv.report import cache_rows
from vkv.kv.segment import SegmentGroup, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.methods.base import Method, SpanWork


@dataclass
class Sequential(Method):
    """Each message of the span compressed on its own, in order, on top of the running compressed cache
    (the seed's sequential multi-turn experiment); targets `oracle` (full history) or `online`."""

    name = "sequential"
    recipe: CompressConfig | None = None  # None: the defaults
    targets: str = "oracle"  # or "online"
    hybrid: HybridConfig | float | None = None  # a HybridConfig, or just the verbatim fraction
    auto_ratio: AutoRatioConfig | None = None

    def settings(self, ratio: float) -> MultiTurnConfig:
        compress = self.recipe or CompressConfig()
        return MultiTurnConfig(
            compress=CompressConfig.from_dict({**compress.to_dict(), "ratio": ratio}),
            targets=self.targets or "oracle",
            hybrid=_hybrid(self.hybrid),
            auto_ratio=self.auto_ratio,
        ).validate()

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> SegmentGroup:
        config = self.settings(ratio)
        cache = SplicedCache()
        if work.start > 0:
            cache.append(verbatim_segment(work.kv.slice(0, work.start), 0))
        turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
        segments = compress_turns(
            work.lm, work.ids, turns, cache, config, FullHistory(work.acts, work.kv), work.message_starts
        )
        rows = cache_rows(SplicedCache(segments))
        return SegmentGroup(
            segments,
            {
                "targets": config.targets,
                "turns": rows,
                "seconds": round(sum(s.stats.get("seconds", 0.0) for s in segments), 3),
            },
        )

    def config(self) -> dict:
        return self.settings(1.0).to_dict() | {"ratio": None}


def _hybrid(option) -> HybridConfig | None:
    """The hybrid option as given: None, a HybridConfig, or just the verbatim fraction."""
    return HybridConfig(fraction=float(option)) if isinstance(option, (int, float)) else option
