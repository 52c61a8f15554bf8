"""KVPrefix: read-only per-layer keys and values that new tokens attend to."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.errors import VkvError
from vkv.kv.flat import FlatHeads


@dataclass
class KVPrefix:
    """Read-only per-layer keys and values `[B, kv_heads, length, head_dim]` that new tokens attend to.

    `bias` (per layer `[B, kv_heads, length]`, or None for none) is added to every new query's attention logit
    for each entry: the fitted or proportional-attention bias compressed entries carry. `valid` `[B, length]`
    (bool) marks the entries that are there when prefixes of different lengths are padded into a batch; None: all.
    `flat` (per layer, or None) holds entries kept per KV head besides the dense ones (a running compressed cache
    with head-wise budgets, `RaggedCache.prefix()`): they take the memory they use until `layer()` pads one layer's
    worth for attention. Such a prefix is extended (`cat`) and moved (`to`), not sliced, selected or batched."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    valid: torch.Tensor | None = None
    bias: list[torch.Tensor] | None = None
    flat: list[FlatHeads | None] | None = None

    @property
    def length(self) -> int:
        """Dense entries per layer and KV head."""
        return self.keys[0].shape[2] if self.keys else 0

    @property
    def is_empty(self) -> bool:
        """No entry to attend to, dense or flat."""
        return not self.length and not any(f is not None and f.keys.shape[0] for f in self.flat or [])

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """What attention reads at layer i: keys and values `[B, kv_heads, L, head_dim]` and the bias `[B or 1, kv_heads,
        L]` float32 (None: none), the flat entries (if any) padded to the layer's longest head first, a temporary."""
        keys, values = self.keys[i], self.values[i]
        bias = None if self.bias is None else self.bias[i].float()
        flat = None if self.flat is None else self.flat[i]
        return (keys, values, bias) if flat is None else flat.before(keys, values, bias)

    def _dense_only(self, what: str) -> None:
        if self.flat is not None and any(f is not None for f in self.flat):
            raise VkvError(f"a prefix with entries kept per KV head cannot be {what}; only extended or moved")

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
        self._dense_only("sliced")
        bias = None if self.bias is None else [b[:, :, start:end] for b in self.bias]
        return KVPrefix([k[:, :, start:end] for k in self.keys], [v[:, :, start:end] for v in self.values], None, bias)

    def select(self, index: torch.Tensor) -> KVPrefix:
        """The entries at `index` `[n]` (in that order) of every layer (a copy)."""
        self._dense_only("selected from")
        if self.valid is not None:
            raise ValueError("selecting entries of a padded batch of prefixes is not supported")
        index = index.to(self.keys[0].device) if self.keys else index
        bias = None if self.bias is None else [b[:, :, index.to(b.device)] for b in self.bias]
        return KVPrefix([k[:, :, index] for k in self.keys], [v[:, :, index] for v in self.values], None, bias)

    def cat(self, other: KVPrefix) -> KVPrefix:
        """self ⊕ other per layer, `other` (dense) moved to self's device and dtype (no copy when either is empty);
        self's flat entries stay as they are."""
        other._dense_only("appended")
        if not self.keys or (not self.length and self.flat is None):
            return other
        if not other.length:
            return self
        bias = None
        if self.bias is not None or other.bias is not None:
            a, b = self.layer_bias(), other.layer_bias()
            bias = [torch.cat([x, y.to(x.device)], dim=2) for x, y in zip(a, b)]
        return KVPrefix(
            [torch.cat([a, b.to(a.device, a.dtype)], dim=2) for a, b in zip(self.keys, other.keys)],
            [torch.cat([a, b.to(a.device, a.dtype)], dim=2) for a, b in zip(self.values, other.values)],
            None,
            bias,
            self.flat,
        )

    def layer_bias(self) -> list[torch.Tensor]:
        """The bias per layer `[B, kv_heads, length]` float32, zeros when there is none."""
        if self.bias is not None:
            return [b.float() for b in self.bias]
        return [torch.zeros(k.shape[:3], device=k.device) for k in self.keys]

    def stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of a batch-1 prefix as `[layers, kv_heads, length, head_dim]` float32 CPU tensors,
        detached: the layout segments store."""
        self._dense_only("stacked")
        keys = torch.cat([k.detach() for k in self.keys]).float().cpu()
        values = torch.cat([v.detach() for v in self.values]).float().cpu()
        return keys, values

    def stacked_bias(self) -> torch.Tensor | None:
        """The bias of a batch-1 prefix as `[layers, kv_heads, length]` float32 CPU, or None."""
        return None if self.bias is None else torch.cat([b.detach() for b in self.bias]).float().cpu()

    def to(self, device: torch.device, dtype: torch.dtype) -> KVPrefix:
        """The same prefix on `device` in `dtype` (no copy when it already is); the bias stays float32."""
        valid = None if self.valid is None else self.valid.to(device)
        bias = None if self.bias is None else [b.to(device, torch.float32) for b in self.bias]
        flat = None if self.flat is None else [None if f is None else f.to(device, dtype) for f in self.flat]
        return KVPrefix(
            [k.to(device, dtype) for k in self.keys], [v.to(device, dtype) for v in self.values], valid, bias, flat
        )

    @classmethod
    def stack(cls, prefixes: list[KVPrefix]) -> KVPrefix:
        """One batch of prefixes, right-padded to the longest (a single copy, made once)."""
        for p in prefixes:
            p._dense_only("batched")
        longest = max(p.length for p in prefixes)
        if longest == 0:
            return cls([], [])
        layers = len(next(p for p in prefixes if p.length).keys)
        sample = next(p for p in prefixes if p.length).keys[0]
        heads, dim = sample.shape[1], sample.shape[3]
        shape = (len(prefixes), heads, longest, dim)
        keys = [sample.new_zeros(shape) for _ in range(layers)]
        values = [sample.new_zeros(shape) for _ in range(layers)]
        with_bias = any(p.bias is not None for p in prefixes)
        bias = [torch.zeros(shape[:3], device=sample.device) for _ in range(layers)] if with_bias else None
        valid = torch.zeros(len(prefixes), longest, dtype=torch.bool, device=sample.device)
        for b, p in enumerate(prefixes):
            for layer in range(p.length and layers):
                keys[layer][b, :, : p.length] = p.keys[layer][0]
                values[layer][b, :, : p.length] = p.values[layer][0]
                if with_bias:
                    bias[layer][b, :, : p.length] = p.layer_bias()[layer][0]
            valid[b, : p.length] = True if p.valid is None else p.valid[0]
        return cls(keys, values, None if bool(valid.all()) else valid, bias)
