"""The per-turn setting shared by every method with a budget: each message of the span is compressed when it ends,
on top of the running compressed cache, as `sequential` vkv does. The message's tokens are fed after everything
kept so far; the method sees the K/V (and queries) they produce there, and its entries join the cache before the
next message. The span's entry budget is shared over the messages in proportion to their lengths.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vkv.errors import VkvError
from vkv.kv.segment import Segment, SegmentGroup
from vkv.kv.spliced import SplicedCache
from vkv.methods.base import SpanWork


def compress_per_turn(work: SpanWork, ratio: float, compress_turn: Callable[[SpanWork, int], Segment]) -> SegmentGroup:
    """`compress_turn(turn_work, budget)` for each message in order, each on the cache the earlier ones left."""
    from vkv.compress.sequential import allocate, message_turns, turn_stats

    cache = work.prefix_cache()
    turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
    segments = []
    for turn, budget in zip(turns, allocate([t.length for t in turns], ratio)):
        segment = compress_turn(TurnWork.on_cache(work, cache, turn), budget)
        segment.stats = {**segment.stats, **turn_stats(turn)}
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

    def prefix_cache(self) -> SplicedCache:
        return SplicedCache(list(self.history.segments), self.history.next_position)

    def attention_between(self, key_range: tuple[int, int], query_range: tuple[int, int]) -> torch.Tensor:
        (ks, ke), (qs, qe) = key_range, query_range
        if not (self.start <= ks < ke <= self.end and self.start <= qs < qe <= self.end):
            raise ValueError(
                f"attention inside a turn: [{qs}, {qe}) → [{ks}, {ke}) leaves the turn [{self.start}, {self.end})"
            )
        from vkv.lm.attention import attention_weights

        if self.history.attention_bias() is not None:
            raise VkvError(
                "attention inside a turn on top of biased entries (per_turn after a method that stores biases, "
                "e.g. mass=nearest or am) is not implemented"
            )
        keys = [k[0] for k in self.history.kv().cat(self.kv).keys]
        positions = torch.cat(
            [s.positions for s in self.history.segments] + [torch.arange(self.start, self.end).float()]
        )
        queries = [q[:, qs - self.start : qe - self.start] for q in self.acts.queries_pre_rope]
        weights = attention_weights(self.lm, queries, torch.arange(qs, qe).float(), keys, positions)
        offset = self.history.physical_length
        return weights[:, :, offset + ks - self.start : offset + ke - self.start]
