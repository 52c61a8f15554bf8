"""The per-turn setting shared by every method with a budget: each message of the span is compressed when it ends,
on top of the running compressed cache, as `sequential` vkv does, by the same loop (`compress_turns`). The message's
tokens are fed after everything kept so far; the method sees the K/V (and queries) they produce there, and its
entries join the cache before the next message. The span's entry budget is shared over the messages in proportion to
their lengths.
"""

from __future__ import annotations

from collections.abc import Callable

from vkv.compress.budget import allocate
from vkv.compress.sequential import Turn, TurnView, compress_turns, message_turns
from vkv.kv.segment import Segment, SegmentGroup
from vkv.kv.spliced import SplicedCache
from vkv.methods.work import SpanWork, TurnWork


def compress_per_turn(work: SpanWork, budget: int, compress_to: Callable[[SpanWork, int], Segment]) -> SegmentGroup:
    """`compress_to(turn_work, entries)` for each message in order, each on the cache the earlier ones left; the
    messages share `budget` entries."""
    turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)

    def compress_turn(history: SplicedCache, turn: Turn, view: TurnView, entries: int) -> Segment:
        return compress_to(TurnWork.on_view(work, history, turn, view), entries)

    budgets = allocate([t.length for t in turns], budget)
    segments = compress_turns(work.lm, work.ids, turns, work.prefix_cache(), budgets, compress_turn, queries=True)
    return SegmentGroup(segments, {"per_turn": True, "turns": len(segments)})
