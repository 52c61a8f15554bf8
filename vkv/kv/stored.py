"""Embeddings-only cache files: what they keep of each segment (the model recomputes the K/V at load,
`vkv.lm.rebuild`), and which segments can be kept that way.

A virtual segment's K/V are a function of its embeddings, positions and the entries before it: after optimising,
the compressor runs the embeddings once more on top of the cache so far, so keeping the embeddings and running that
pass again gives the same K/V. A verbatim segment's K/V are its tokens fed on top of everything before it, so its
token ids suffice. Segments whose K/V came from anywhere else cannot be rebuilt and are refused at save
(`check_rebuildable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vkv.errors import VkvError
from vkv.kv.segment import Segment, SeparableBias


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


@dataclass
class StoredCache:
    """An embeddings-only file as read, before a model rebuilds its K/V (`vkv.lm.rebuild`)."""

    segments: list[StoredSegment]
    next_position: int
    meta: dict[str, Any]


def check_rebuildable(segments: list[Segment], ids: Sequence[int] | None, path) -> None:
    """Refuse, before writing, a segment whose K/V `rebuild` would not reproduce."""
    compressed = False
    for i, seg in enumerate(segments):
        where = f"{path}: field segments[{i}]"
        if seg.kind == "compact":
            raise VkvError(
                f"{where}.kind: a compact segment holds entries chosen per head (am, kvzip, vkv with a per-head "
                "verbatim share), which no forward pass rebuilds; save it with store kv"
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
            if seg.slots != seg.original_tokens or not torch.equal(
                seg.positions.float(), torch.arange(*seg.span).float()
            ):
                raise VkvError(
                    f"{where}.positions: a verbatim segment rebuilt from ids holds one entry per token at positions "
                    f"{seg.span[0]}..{seg.span[1] - 1}"
                )
        compressed = compressed or seg.kind != "verbatim"
