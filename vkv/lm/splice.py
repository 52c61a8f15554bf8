"""The one way a compressed span enters a cache: the prefix verbatim, the span's segments, the tail re-encoded.

Tokens after the span are fed again on top of the compressed cache at their original logical positions, so
nothing they carry was computed with the uncompressed span in view.
"""

from __future__ import annotations

from collections.abc import Iterable

from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM


def splice(
    lm: FrozenLM,
    kv: KVPrefix,
    start: int,
    end: int,
    segments: Segment | Iterable[Segment] | None,
    tail: list[int],
) -> SplicedCache:
    """Tokens [0, start) verbatim from `kv` (the real K/V of at least those tokens, batch 1), then `segments`
    standing for [start, end) in span order (None: the span is dropped), then the `tail` tokens re-encoded on
    top at logical positions end, end + 1, …"""
    spliced = SplicedCache()
    if start > 0:
        spliced.append(verbatim_segment(kv.slice(0, start), 0))
    for segment in [] if segments is None else [segments] if isinstance(segments, Segment) else segments:
        spliced.append(segment)
    spliced.next_position = end
    if tail:
        spliced.append(reencode(lm, spliced, tail))
    return spliced


def reencode(lm: FrozenLM, spliced: SplicedCache, ids: list[int]) -> Segment:
    """Verbatim K/V of `ids` computed on top of the spliced cache at its next logical positions."""
    context = Context(lm, spliced)
    context.feed(ids)
    return verbatim_segment(context.cache.fed(), spliced.next_position)
