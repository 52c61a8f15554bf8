"""The per-turn setting shared by every method with a budget: each message of the span is compressed when it ends,
on top of the running compressed cache, as vkv per turn does, by the same loop (`compress_turns`). The message's
tokens are fed after everything kept so far; the method sees the K/V (and queries) they produce there, and its
entries join the cache before the next message. The span's entry budget is shared over the messages in proportion to
their lengths.
"""

from __future__ import annotations

from collections.abc import Callable

from vkv.compress.budget import allocate
from vkv.compress.sequential import compress_turns
from vkv.compress.turn import Turn, TurnView, message_turns
from vkv.compress.work import SpanWork, TurnWork
from vkv.kv.segment import Segment, SegmentGroup
from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM


def compress_per_turn(work: SpanWork, budget: int, compress_to: Callable[[SpanWork, int], Segment]) -> SegmentGroup:
    """`compress_to(turn_work, entries)` for each message in order, each on the cache the earlier ones left; the
    messages share `budget` entries."""
    turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
    compress_turn = turn_compressor(work.lm, work.ids, work.message_starts, work.message_roles, work.seed, compress_to)
    budgets = allocate([t.length for t in turns], budget)
    segments = compress_turns(work.lm, work.ids, turns, work.prefix_cache(), budgets, compress_turn, queries=True)
    return SegmentGroup(segments, {"per_turn": True, "turns": len(segments)})


def turn_compressor(
    lm: FrozenLM,
    ids: list[int],
    message_starts: list[int],
    message_roles: list[str],
    seed: int,
    compress_to: Callable[[SpanWork, int], Segment],
) -> Callable[[SplicedCache, Turn, TurnView, int], Segment]:
    """The `compress_turn` of `compress_turns` for a method's `compress_to`: each message, as the running cache's
    loop feeds it, given to the method as a TurnWork (the per-turn eval's and a Session's one path)."""

    def compress_turn(history: SplicedCache, turn: Turn, view: TurnView, entries: int) -> Segment:
        return compress_to(TurnWork.fed(lm, ids, message_starts, message_roles, seed, history, turn, view), entries)

    return compress_turn
