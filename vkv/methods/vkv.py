"""vkv's virtual tokens as a method: one method whose modes are fields, as every method's options are. `per_turn`
compresses each message when it ends, on the running cache, `every` each chunk of messages, and under a `cap` the
history is refitted by attention matching when it would exceed it; the recipe's `verbatim` says which verbatim part
sits beside the virtual tokens (per-head, shared or none) and `auto_ratio` lets each turn choose its ratio."""

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from vkv.compress.attention_matching import AttentionMatchingFit
from vkv.compress.config import CompressConfig
from vkv.compress.history import HistoryWork, Loop
from vkv.compress.recipe import VkvRecipe, recipe_segment
from vkv.compress.sequential import FullHistory, append_verbatim, compress_virtual_turns
from vkv.compress.turn import Turn, message_turns
from vkv.compress.work import SpanWork
from vkv.kv.report import cache_rows
from vkv.kv.segment import Segment, SegmentGroup
from vkv.kv.spliced import SplicedCache
from vkv.methods.base import LATER_LOOP_FIELDS, PerTurnMethod


@dataclass
class VirtualTokens(PerTurnMethod):
    """vkv: virtual tokens optimised so their per-layer V match surprisal-pooled targets, beside the recipe's verbatim
    part; per turn (`per_turn`), each message's on top of the running compressed cache, with targets from the full
    history (`oracle`) or from the running cache (`online`)."""

    name = "vkv"
    reports_steps = True
    recipe_class: ClassVar[type] = VkvRecipe
    recipe: VkvRecipe | CompressConfig | None = None  # None: the defaults; a CompressConfig: its virtual tokens'

    def __post_init__(self) -> None:
        if isinstance(self.recipe, CompressConfig):  # the virtual tokens' recipe alone, the rest at the defaults
            self.recipe = VkvRecipe(compress=self.recipe)
        super().__post_init__()
        self.settings()  # a recipe no path can run is refused as the method is built, not at its first span

    def settings(self) -> VkvRecipe:
        """The recipe resolved once (`VkvRecipe.validate`), and again only when `recipe` is given another value: what
        runs below this method is not validated again."""
        resolved = getattr(self, "_resolved", None)
        if resolved is None or resolved[0] is not self.recipe:
            resolved = self._resolved = (self.recipe, (self.recipe or VkvRecipe()).validate())
        return resolved[1]

    @property
    def question_aware(self) -> bool:
        return self.settings().compress.pooling == "attention"

    @property
    def turn_by_turn(self) -> bool:
        """Whether the span is compressed turn by turn on the running cache (a loop, or auto-ratio's one turn), the
        only way its targets' source is read."""
        return self.looped or self.settings().auto_ratio

    @property
    def chooses_ratio(self) -> bool:
        """Whether each turn chooses its own ratio (auto-ratio), so that no ratio is given."""
        return self.settings().auto_ratio

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> Segment | SegmentGroup:
        self.check()
        recipe = self.settings()
        return self._compressed(work, None if recipe.auto_ratio else work.budget(ratio), recipe, on_step)

    def compress_to(self, work: SpanWork, budget: int, on_step=None) -> Segment | SegmentGroup:
        return self._compressed(work, budget, self.settings(), on_step)

    def _compressed(self, work: SpanWork, budget: int | None, recipe: VkvRecipe, on_step) -> Segment | SegmentGroup:
        """The span's segment: turn by turn (per turn, in chunks, or the span as one turn choosing its ratio), or the
        whole span as the recipe's pipeline makes it."""
        if self.turn_by_turn:
            return _turn_by_turn(work, budget, recipe, self)
        return recipe_segment(work, recipe, budget, on_step)

    def compress_messages(self, lm, ids, turns, cache, budget, message_starts, message_roles, seed=0, on_turn=None):
        """Each of `turns` compressed in order on the running `cache` (a Session's messages), as per turn: oracle
        targets read the full history of the turns, captured here."""
        recipe = self.settings()
        history = None
        if recipe.target_source == "oracle":
            history = FullHistory.capture(lm, ids, turns[0].start, turns[-1].end)
        budget = None if recipe.auto_ratio else budget
        return _virtual_loop(lm, ids, turns, cache, recipe, budget, history, self.loop(), on_turn=on_turn)

    def config(self) -> dict[str, Any]:
        """The recipe and the loop; the targets' source only where a loop or auto-ratio reads it (a whole span's
        targets are the span's own), so that no run's identity carries a setting that does not act on it."""
        config = self.settings().to_dict()
        if not self.turn_by_turn:
            del config["target_source"]
        return {**config, **self.loop_config()}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "VirtualTokens":
        config = dict(config)
        loop = {k: config.pop(k) for k in ("per_turn", *LATER_LOOP_FIELDS) if k in config}
        return cls(recipe=VkvRecipe.from_dict(config), **loop)

    def compact_history(self, work: HistoryWork, entries: int) -> Segment:
        """Attention matching's refit of the history's entries (virtual ones are entries like any other), with am's
        options as the recipe's am-sourced verbatim part takes them."""
        return AttentionMatchingFit(head_budget=self.settings().compress.head_budget).refit_history(work, entries)


def _turn_by_turn(work: SpanWork, budget: int | None, recipe: VkvRecipe, method: VirtualTokens) -> SegmentGroup:
    """The span's messages or chunks as the method's loop meets them, or the span as one turn (auto-ratio), each
    compressed on the cache the earlier ones left, with targets from the work's full history or from that cache."""
    turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
    loop = method.loop() if method.looped else Loop()
    if not method.looped:
        turns = [Turn(turns[0].first, turns[-1].last, None, work.start, work.end)]
    history = FullHistory(work.acts, work.kv)
    segments = _virtual_loop(
        work.lm, work.ids, turns, work.prefix_cache(), recipe, budget, history, loop, work.message_starts
    )
    seconds = round(sum(s.stats.get("seconds", 0.0) for s in segments), 3)
    stats = {"targets": recipe.target_source, "turns": cache_rows(SplicedCache(segments)), "seconds": seconds}
    return SegmentGroup(segments, {**stats, **loop.stats(segments)})


def _virtual_loop(lm, ids, turns, cache, recipe, budget, history, loop: Loop, message_starts=None, on_turn=None):
    """vkv's turn-by-turn compression of `turns` as `loop` meets them: chunks compressed on the running `cache` under
    the loop's cap, its recent turns appended verbatim; the segments standing for `turns`."""
    chunks, kept = loop.split(turns)
    left = loop.left(budget, chunks, kept)
    segments = compress_virtual_turns(lm, ids, chunks, cache, recipe, left, history, message_starts, on_turn, loop.cap)
    append_verbatim(lm, cache, ids, kept)
    return segments + cache.segments[len(cache.segments) - len(kept) :]


@dataclass
class MeanPool(VirtualTokens):
    """The virtual tokens' pooled initial embeddings, not optimised: what optimisation adds over pooling."""

    name = "meanpool"
    reports_steps = False  # it takes no optimisation step, so no progress bar counts them

    def settings(self) -> VkvRecipe:
        recipe = super().settings()
        compress = replace(recipe.compress, optim=replace(recipe.compress.optim, steps=0))
        return replace(recipe, compress=compress)
