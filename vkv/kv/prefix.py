"""KVPrefix: read-only per-layer keys and values that new tokens attend to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vkv.lm.frozen import FrozenLM


@dataclass
class KVPrefix:
    """Read-only per-layer keys and values `[B, kv_heads, length, head_dim]` that new tokens attend to.

    `valid` `[B, length]` (bool) marks real entries when prefixes of different lengths are padded into a
    batch; None means all entries are real."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    valid: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    @classmethod
    def from_cache(cls, cache, length: int | None = None) -> KVPrefix:
        """Views of the first `length` entries of a transformers cache (no copy)."""
        keys = [layer.keys[:, :, :length] for layer in cache.layers]
        values = [layer.values[:, :, :length] for layer in cache.layers]
        return cls(keys, values)

    @classmethod
    def empty(cls) -> KVPrefix:
        return cls([], [])

    def slice(self, start: int, end: int | None = None) -> KVPrefix:
        """Views of entries [start, end) of every layer (no copy)."""
        return KVPrefix([k[:, :, start:end] for k in self.keys], [v[:, :, start:end] for v in self.values])

    def select(self, index: torch.Tensor) -> KVPrefix:
        """The entries at `index` `[n]` (in that order) of every layer (a copy)."""
        if self.valid is not None:
            raise ValueError("selecting entries of a padded batch of prefixes is not supported")
        index = index.to(self.keys[0].device) if self.keys else index
        return KVPrefix([k[:, :, index] for k in self.keys], [v[:, :, index] for v in self.values])

    def cat(self, other: KVPrefix) -> KVPrefix:
        """self ⊕ other per layer, `other` moved to self's device and dtype (no copy when either is empty)."""
        if not self.length:
            return other
        if not other.length:
            return self
        return KVPrefix(
            [torch.cat([a, b.to(a.device, a.dtype)], dim=2) for a, b in zip(self.keys, other.keys)],
            [torch.cat([a, b.to(a.device, a.dtype)], dim=2) for a, b in zip(self.values, other.values)],
        )

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of a batch-1 prefix as `[layers, kv_heads, length, head_dim]` float32 CPU tensors,
        detached: the layout segments store."""
        keys = torch.cat([k.detach() for k in self.keys]).float().cpu()
        values = torch.cat([v.detach() for v in self.values]).float().cpu()
        return keys, values

    def to(self, device: torch.device, dtype: torch.dtype) -> KVPrefix:
        """The same prefix on `device` in `dtype` (no copy when it already is)."""
        valid = None if self.valid is None else self.valid.to(device)
        return KVPrefix([k.to(device, dtype) for k in self.keys], [v.to(device, dtype) for v in self.values], valid)

    def to_dynamic_cache(self, lm: FrozenLM):
        """A transformers DynamicCache holding these entries on the model's device and dtype (autograd-tracked
        when the entries are)."""
        cache = lm.new_cache()
        for layer, (k, v) in enumerate(zip(self.keys, self.values)):
            cache.update(k.to(lm.device, lm.dtype), v.to(lm.device, lm.dtype), layer)
        return cache

    @classmethod
    def stack(cls, prefixes: list[KVPrefix]) -> KVPrefix:
        """One batch of prefixes, right-padded to the longest (a single copy, made once)."""
        longest = max(p.length for p in prefixes)
        if longest == 0:
            return cls([], [])
        layers = len(next(p for p in prefixes if p.length).keys)
        sample = next(p for p in prefixes if p.length).keys[0]
        heads, dim = sample.shape[1], sample.shape[3]
        shape = (len(prefixes), heads, longest, dim)
        keys = [sample.new_zeros(shape) for _ in range(layers)]
        values = [sample.new_zeros(shape) for _ in range(layers)]
        valid = torch.zeros(len(prefixes), longest, dtype=torch.bool, device=sample.device)
        for b, p in enumerate(prefixes):
            for layer in range(p.length and layers):
                keys[layer][b, :, : p.length] = p.keys[layer][0]
                values[layer][b, :, : p.length] = p.values[layer][0]
            valid[b, : p.length] = True if p.valid is None else p.valid[0]
        return cls(keys, values, None if bool(valid.all()) else valid)
