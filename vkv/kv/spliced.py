"""SplicedCache: an ordered list of K/V segments (verbatim or virtual) plus the next logical position.

Physical length (entries in the cache) and logical position (where the next token sits on the RoPE axis)
differ once a span is compressed: a span of 300 tokens may be 94 virtual entries, yet the next token still
sits at the position it had in the uncompressed conversation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.kv.ragged import RaggedCache
from vkv.kv.segment import KINDS, Segment


@dataclass
class SplicedCache:
    segments: list[Segment] = field(default_factory=list)
    next_position: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def fork(self) -> SplicedCache:
        """A copy to append to without changing this one (the segments themselves are shared, not copied)."""
        return SplicedCache(list(self.segments), self.next_position)

    def append(self, segment: Segment, next_position: int | None = None) -> None:
        if segment.kind not in KINDS:
            raise VkvError(f"unknown segment kind '{segment.kind}'")
        if self.segments and segment.span[0] < self.segments[-1].span[1]:
            raise VkvError(f"segment {segment.span} overlaps the previous one {self.segments[-1].span}")
        self.segments.append(segment)
        self.next_position = segment.span[1] if next_position is None else next_position

    @property
    def physical_length(self) -> int:
        return sum(s.slots for s in self.segments)

    def kv(self) -> KVPrefix:
        """Per-layer concatenation of all segments, `[1, kv_heads, physical_length, head_dim]` each (empty
        when there are none)."""
        if not self.segments:
            return KVPrefix.empty()
        layers = self.segments[0].keys.shape[0]
        keys = [torch.cat([s.keys[layer] for s in self.segments], dim=1)[None] for layer in range(layers)]
        values = [torch.cat([s.values[layer] for s in self.segments], dim=1)[None] for layer in range(layers)]
        bias = self.attention_bias()
        return KVPrefix(keys, values, None, None if bias is None else [b[None] for b in bias])

    def attention_bias(self) -> torch.Tensor | None:
        """Every entry's bias `[layers, kv_heads, physical_length]` (0 for segments without one); None when no
        segment has one."""
        if all(s.bias is None for s in self.segments):
            return None
        return torch.cat(
            [torch.zeros(s.keys.shape[:3]) if s.bias is None else s.bias.float() for s in self.segments], dim=2
        )

    def prefix(self, shape: tuple[int, int, int], device: torch.device | str, dtype: torch.dtype) -> KVPrefix:
        """The segments as a read-only prefix for the direct forward (`shape`: the model's layers, KV heads, head
        size), each head's entries only (no padding): a running compressed cache that something is optimised on."""
        return self.ragged(shape, device, dtype).prefix()

    def ragged(
        self, shape: tuple[int, int, int], device: torch.device | str, dtype: torch.dtype, padded: bool = False
    ) -> RaggedCache:
        """The transformers Cache that decodes on these segments (`shape`: the model's layers, KV heads, head size):
        each head's entries only, unless `padded` (see `RaggedCache.from_segments`)."""
        return RaggedCache.from_segments(self.segments, self.next_position, shape, device, dtype, padded)

    def span_entries(self, start: int, end: int, padded: bool = False) -> float:
        """Entries per KV head of the segments standing for original tokens inside [start, end), or with `padded`
        their slots, what a padded cache stores (head-wise budgets pad the heads that keep fewer)."""
        inside = [s for s in self.segments if start <= s.span[0] and s.span[1] <= end]
        return sum(s.slots if padded else s.real_entries for s in inside)

    def table(self) -> list[dict[str, Any]]:
        return [s.row() for s in self.segments]
