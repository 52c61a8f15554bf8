from dataclasses import dataclass
from typing import ClassVar

from vkv.compress.sequential import FullHistory, MultiTurnConfig, compress_virtual_turns
from vkv.compress.turn import message_turns
from vkv.compress.work import SpanWork
from vkv.kv.report import cache_rows
from vkv.kv.segment import SegmentGroup
from vkv.kv.spliced import SplicedCache
from vkv.methods.base import BudgetMethod


@dataclass
class Sequential(BudgetMethod):
    """vkv per turn (`--method vkv --per-turn`; registered, and recorded in run ids, under its earlier name
    `sequential`, so stored runs keep their ids): each message of the span compressed into virtual tokens on its own,
    in order, on top of the running compressed cache, with targets from the full history (`oracle`) or from the
    running cache (`online`), optional per-turn verbatim tokens and per-turn ratios."""

    name = "sequential"
    recipe_class: ClassVar[type] = MultiTurnConfig
    recipe: MultiTurnConfig | None = None  # None: the defaults

    def settings(self) -> MultiTurnConfig:
        return (self.recipe or MultiTurnConfig()).validate()

    def compress_to(self, work: SpanWork, budget: int, on_step=None) -> SegmentGroup:
        config = self.settings()
        turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
        history = FullHistory(work.acts, work.kv)
        budget = None if config.auto_ratio else budget
        segments = compress_virtual_turns(
            work.lm, work.ids, turns, work.prefix_cache(), config, budget, history, work.message_starts
        )
        seconds = round(sum(s.stats.get("seconds", 0.0) for s in segments), 3)
        stats = {"targets": config.target_source, "turns": cache_rows(SplicedCache(segments)), "seconds": seconds}
        return SegmentGroup(segments, stats)

    def config(self) -> dict:
        return self.settings().to_dict()
