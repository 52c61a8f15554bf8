"""Eviction methods: keep a budget of the span's own K/V entries at their original positions; only the choice of
entries differs, so a method is one `select`, and this base class owns the rest, including the per-turn setting.

Per turn (`per_turn=True`), each message of the span is compressed when it ends, on top of the running compressed
cache, as `sequential` vkv does: the message's tokens are fed after the entries kept so far, the method selects
from the K/V they produce (and scores with the queries they produce), and the kept entries join the cache before
the next message. The span's entry budget is shared over the messages in proportion to their lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.errors import VkvError
from vkv.kv.segment import Segment, SegmentGroup, mass_bias, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.methods.base import Method, SpanWork

MASS_RULES = ("none", "nearest")


def nearest_mass(kept: torch.Tensor, n: int) -> torch.Tensor:
    """Tokens each kept entry stands for `[t]` (kept: ascending span-relative indices): itself and every dropped
    token nearer to it than to any other kept one (ties go to the earlier); they sum to n."""
    distance = (torch.arange(n)[:, None] - kept[None, :]).abs()  # [n, t]
    return torch.bincount(distance.argmin(dim=1), minlength=len(kept)).float()


@dataclass
class EvictionMethod(Method):
    """A KV-eviction method: `select(work, budget)` returns the span-relative indices of the entries to keep."""

    per_turn: bool = False  # compress each message when it ends, on top of the running compressed cache
    mass: str = "none"  # "nearest": each kept entry's bias is log(1 + the dropped tokens nearest to it), the lever
    # proportional attention gives vkv

    def select(self, work: SpanWork, budget: int) -> torch.Tensor:
        raise NotImplementedError

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> Segment | SegmentGroup:
        if self.mass not in MASS_RULES:
            raise VkvError(
                f"{self.name}: field mass: unknown value '{self.mass}'; choose one of {', '.join(MASS_RULES)}"
            )
        if self.per_turn:
            return self.compress_per_turn(work, ratio)
        return self.keep(work, self.select(work, work.budget(ratio)))

    def keep(self, work: SpanWork, index: torch.Tensor) -> Segment:
        segment = work.keep(index)
        if self.mass == "nearest":
            kept = segment.positions.long() - work.start
            segment.bias = mass_bias(nearest_mass(kept, work.span_length), *segment.keys.shape[:2])
        return segment

    def compress_per_turn(self, work: SpanWork, ratio: float) -> SegmentGroup:
        from vkv.compress.sequential import allocate, message_turns, turn_stats

        cache = SplicedCache()
        if work.start > 0:
            cache.append(verbatim_segment(work.kv.slice(0, work.start), 0))
        turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
        segments = []
        for turn, budget in zip(turns, allocate([t.length for t in turns], ratio)):
            turn_work = TurnWork.on_cache(work, cache, turn)
            segment = self.keep(turn_work, self.select(turn_work, budget))
            segment.stats = turn_stats(turn)
            cache.append(segment)
            segments.append(segment)
        return SegmentGroup(segments, {"per_turn": True, "turns": len(segments)})


class TurnWork(SpanWork):
    """One message's tokens as the model computed them on top of a running compressed cache (`history`): kv holds
    the message's own entries only, and attention is computed over the history's entries plus the message's."""

    @classmethod
    def on_cache(cls, work: SpanWork, history: SplicedCache, turn) -> TurnWork:
        """The turn's tokens fed on top of `history` (which must end where the turn starts), queries kept."""
        from vkv.compress.sequential import view_on_cache

        view = view_on_cache(work.lm, history, work.ids, turn, queries=True)
        return cls(
            work.lm,
            work.ids,
            turn.start,
            turn.end,
            view.kv,
            view.acts,
            work.message_starts,
            work.seed,
            message_roles=work.message_roles,
            kv_start=turn.start,
            history=history,
        )

    def __init__(self, *args, history: SplicedCache, **kwargs):
        super().__init__(*args, **kwargs)
        self.history = history

    def attention_between(self, key_range: tuple[int, int], query_range: tuple[int, int]) -> torch.Tensor:
        (ks, ke), (qs, qe) = key_range, query_range
        if not (self.start <= ks < ke <= self.end and self.start <= qs < qe <= self.end):
            raise ValueError(
                f"attention inside a turn: [{qs}, {qe}) → [{ks}, {ke}) leaves the turn [{self.start}, {self.end})"
            )
        from vkv.lm.attention import attention_weights

        if self.history.attention_bias() is not None:
            raise VkvError(
                "attention inside a turn on top of biased entries (per_turn with mass=nearest) is not implemented"
            )
        keys = [k[0] for k in self.history.kv().cat(self.kv).keys]
        positions = torch.cat(
            [s.positions for s in self.history.segments] + [torch.arange(self.start, self.end).float()]
        )
        queries = [q[:, qs - self.start : qe - self.start] for q in self.acts.queries_pre_rope]
        weights = attention_weights(self.lm, queries, torch.arange(qs, qe).float(), keys, positions)
        offset = self.history.physical_length
        return weights[:, :, offset + ks - self.start : offset + ke - self.start]
