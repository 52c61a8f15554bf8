"""Segment: K/V entries standing for a range of original tokens; SegmentGroup: several that stand for one span."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from vkv.kv.prefix import KVPrefix

KINDS = ("verbatim", "virtual")


@dataclass
class Segment:
    """K/V entries standing for original tokens [span[0], span[1])."""

    kind: str
    span: tuple[int, int]
    keys: torch.Tensor  # [layers, kv_heads, entries, head_dim], post-RoPE, as the model stores them
    values: torch.Tensor  # [layers, kv_heads, entries, head_dim]
    positions: torch.Tensor  # [entries] float32 logical positions
    embeddings: torch.Tensor | None = None  # [entries, hidden] for virtual segments
    stats: dict[str, Any] = field(default_factory=dict)
    mass: torch.Tensor | None = None  # [entries] original tokens each entry stands for; later queries add
    # log(mass) to their attention logits (proportional attention); None: one token each, no bias

    @property
    def entries(self) -> int:
        return self.keys.shape[2]

    @property
    def original_tokens(self) -> int:
        return self.span[1] - self.span[0]

    @property
    def ratio(self) -> float:
        return self.original_tokens / max(self.entries, 1)

    def row(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "span": list(self.span),
            "entries": self.entries,
            "ratio": round(self.ratio, 4),
            **{k: v for k, v in self.stats.items() if not isinstance(v, (list, dict))},
        }


def verbatim_segment(cache_or_prefix, start: int, end: int) -> Segment:
    """Real K/V of original tokens [start, end) from a transformers cache or KVPrefix holding them."""
    prefix = cache_or_prefix if isinstance(cache_or_prefix, KVPrefix) else KVPrefix.from_cache(cache_or_prefix)
    keys = torch.stack([k[0, :, start:end] for k in prefix.keys])
    values = torch.stack([v[0, :, start:end] for v in prefix.values])
    return Segment("verbatim", (start, end), keys.detach(), values.detach(), torch.arange(start, end).float())


class SegmentGroup(list):
    """Segments in span order (non-overlapping), plus stats describing the whole group."""

    def __init__(self, segments: Iterable[Segment] = (), stats: dict[str, Any] | None = None):
        super().__init__(segments)
        self.stats: dict[str, Any] = stats or {}

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self)

    @property
    def original_tokens(self) -> int:
        return sum(s.original_tokens for s in self)
