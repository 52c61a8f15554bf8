"""The agent's loop shared by every method with a budget: each message of the span (or each chunk of messages of at
least `every` tokens) is compressed when it ends, on top of the running compressed cache, as vkv per turn does, by
the same loop (`compress_turns`); the messages within the span's last `recent` tokens stay verbatim. The chunk's tokens are fed after everything kept so far; the method sees the K/V
(and queries) they produce there, and its entries join the cache before the next chunk. The span's entry budget is
shared over the chunks in proportion to their lengths; under a cap the history is compacted again when it would
exceed it (compress/history.py).
"""

from __future__ import annotations

from collections.abc import Callable

from vkv.compress.budget import allocate
from vkv.compress.history import Loop
from vkv.compress.sequential import append_verbatim, compress_turns
from vkv.compress.turn import Turn, TurnView, message_turns
from vkv.compress.work import SpanWork, TurnWork
from vkv.kv.segment import Segment, SegmentGroup
from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM


def compress_per_turn(work: SpanWork, budget: int, method) -> SegmentGroup:
    """`method.compress_to(turn_work, entries)` for each message (or chunk) of the span in order, each on the cache the
    earlier ones left, as `method.loop()` says; they share `budget` entries."""
    turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
    starts, roles, loop = work.message_starts, work.message_roles, method.loop()
    segments = method.compress_messages(work.lm, work.ids, turns, work.prefix_cache(), budget, starts, roles, work.seed)
    chunks, _ = loop.split(turns)
    return SegmentGroup(segments, {"per_turn": True, "turns": len(chunks), **loop.stats(segments)})


def compress_messages(
    lm: FrozenLM,
    ids: list[int],
    turns: list[Turn],
    cache: SplicedCache,
    budget: int,
    message_starts: list[int],
    message_roles: list[str],
    seed: int,
    compress_to: Callable[[SpanWork, int], Segment],
    on_turn: Callable[[Turn, Segment], None] | None = None,
    loop: Loop | None = None,
) -> list[Segment]:
    """`compress_to(turn_work, entries)` for each of `turns` in order (or each chunk of them, as `loop` says) on the
    running `cache` (which ends where the first starts), sharing `budget` entries in proportion to their lengths,
    under the loop's cap, its recent turns kept verbatim: the per-turn eval's and a Session's one loop."""
    loop = loop or Loop()
    compress_turn = turn_compressor(lm, ids, message_starts, message_roles, seed, compress_to)
    chunks, kept = loop.split(turns)
    budgets = allocate([t.length for t in chunks], loop.left(budget, chunks, kept))
    segments = compress_turns(lm, ids, chunks, cache, budgets, compress_turn, True, on_turn, loop.cap, seed)
    append_verbatim(lm, cache, ids, kept)
    return segments + cache.segments[len(cache.segments) - len(kept) :]


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
