"""Embeddings-only cache files: what they keep of each segment, and its K/V recomputed with the model at load.

A virtual segment's K/V are a function of its embeddings, positions and the entries before it: after optimising,
the compressor runs the embeddings once more on top of the cache so far (`virtual_kv`), so keeping the embeddings
and running that pass again gives the same K/V. A verbatim segment's K/V are its tokens fed on top of everything
before it (`reencode`), so its token ids suffice. Segments whose K/V came from anywhere else cannot be rebuilt
and are refused at save (`check_rebuildable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, SeparableBias
from vkv.kv.splice import reencode
from vkv.kv.spliced import SplicedCache

if TYPE_CHECKING:
    from vkv.lm.frozen import FrozenLM


@dataclass
class StoredSegment:
    """A segment as an embeddings-only file keeps it: no keys or values."""

    kind: str  # verbatim or virtual
    span: tuple[int, int]
    positions: torch.Tensor  # [entries] float32
    ids: list[int] | None = None  # verbatim: the tokens [span[0], span[1])
    embeddings: torch.Tensor | None = None  # virtual: [entries, hidden] float32
    bias: torch.Tensor | None = None  # [layers, kv_heads, entries]
    stats: dict[str, Any] = field(default_factory=dict)
    separable: SeparableBias | None = None  # `bias` as the file stored it, when per-entry and per-head numbers


def virtual_kv(
    lm: FrozenLM, embeddings: torch.Tensor, positions: torch.Tensor, prefix: KVPrefix
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values `[layers, kv_heads, k, head_dim]` (float32, CPU) of virtual embeddings `[k, hidden]` at
    `positions` `[k]` on top of `prefix`: the pass that gives a virtual segment its K/V after optimisation."""
    with torch.no_grad():
        keys, values = lm.forward_kv(embeddings[None].to(lm.device), positions, prefix)
    return torch.cat(keys).float().cpu(), torch.cat(values).float().cpu()


def rebuild(lm: FrozenLM, stored: list[StoredSegment], next_position: int, meta: dict[str, Any]) -> SplicedCache:
    """The SplicedCache of an embeddings-only file: segments recomputed in order, each on top of those before."""
    cache = SplicedCache(meta=meta)
    for s in stored:
        if s.kind == "verbatim":
            cache.next_position = s.span[0]  # reencode feeds at the cache's next position
            segment = reencode(lm, cache, s.ids)
        else:
            # the compressor's prefix is on the model's device in its dtype (single span) or float32 segments
            # (sequential), which forward_kv casts to that dtype: the same numbers either way
            keys, values = virtual_kv(lm, s.embeddings, s.positions, cache.kv().to(lm.device, lm.dtype))
            segment = Segment(s.kind, s.span, keys, values, s.positions, s.embeddings)
        segment.stats, segment.bias, segment.separable = s.stats, s.bias, s.separable
        cache.append(segment)
    cache.next_position = next_position
    return cache


def check_rebuildable(segments: list[Segment], ids: Sequence[int] | None, path) -> None:
    """Refuse, before writing, a segment whose K/V `rebuild` would not reproduce."""
    compressed = False
    for i, seg in enumerate(segments):
        where = f"{path}: field segments[{i}]"
        if seg.kind == "compact":
            raise VkvError(
                f"{where}.kind: a compact segment holds real keys chosen per head (am, kvzip), which no forward pass "
                "rebuilds; save it with store kv"
            )
        if seg.kind == "virtual" and (seg.embeddings is None or seg.stats.get("verbatim_entries")):
            raise VkvError(
                f"{where}: a virtual segment without embeddings, or a hybrid one whose kept tokens' K/V were computed "
                "with the whole turn in view, cannot be rebuilt from embeddings; save it with store kv"
            )
        if seg.kind == "verbatim" and compressed and seg.stats.get("targets") == "oracle":
            raise VkvError(
                f"{where}: a turn kept verbatim under oracle targets carries K/V computed with the uncompressed "
                "history, which feeding its tokens on the compressed cache does not reproduce; save it with store kv"
            )
        if seg.kind == "verbatim":
            if ids is None or len(ids) < seg.span[1]:
                raise VkvError(
                    f"{where}: an embeddings-only file keeps a verbatim segment's token ids; pass the rendered ids "
                    f"covering its span {list(seg.span)}"
                )
            if seg.entries != seg.original_tokens or not torch.equal(
                seg.positions.float(), torch.arange(*seg.span).float()
            ):
                raise VkvError(
                    f"{where}.positions: a verbatim segment rebuilt from ids holds one entry per token at positions "
                    f"{seg.span[0]}..{seg.span[1] - 1}"
                )
        compressed = compressed or seg.kind != "verbatim"
