"""The attention kernel of the direct forward, its masks, and the recording cache of the model's own forward."""

from __future__ import annotations

import torch

from vkv.kv.prefix import KVPrefix
from vkv.kv.ragged import RaggedCache, RaggedLayer


def attention_masks(
    new_length: int, prefix: KVPrefix, token_mask: torch.Tensor | None, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Additive masks for new tokens attending to the prefix (`[B, 1, 1, L]`, None when nothing is padded)
    and to each other (`[B, 1, n, n]`, B = 1 without a token mask): every real prefix entry is visible, and
    the real new tokens up to and including oneself."""
    blocked_new = torch.ones(new_length, new_length, dtype=torch.bool, device=device).triu(1)[None]
    if token_mask is not None:
        blocked_new = blocked_new | ~token_mask.to(device, torch.bool)[:, None, :]
    new_bias = torch.zeros(blocked_new.shape, dtype=dtype, device=device).masked_fill_(
        blocked_new, torch.finfo(dtype).min
    )
    prefix_bias = None
    if prefix.valid is not None:
        blocked = ~prefix.valid.to(device)[:, None, None, :]
        prefix_bias = torch.zeros(blocked.shape, dtype=dtype, device=device).masked_fill_(
            blocked, torch.finfo(dtype).min
        )
    return prefix_bias, new_bias[:, None]


def with_entry_bias(
    masks: tuple[torch.Tensor | None, torch.Tensor], bias: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """`attention_masks`' prefix mask plus one layer's prefix bias `[B, kv_heads, L]` (as `[B, kv_heads, 1, L]`: per KV
    head, shared by the query heads of its group, as `attend` lays them out)."""
    if bias is None:
        return masks
    entry = bias[:, :, None, :].float()
    return (entry if masks[0] is None else masks[0] + entry), masks[1]


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_keys: torch.Tensor | None,
    prefix_values: torch.Tensor | None,
    masks: tuple[torch.Tensor | None, torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """Softmax attention of queries `[B, heads, n, D]` over a read-only prefix `[B, kv_heads, L, D]` and the
    new keys/values `[B, kv_heads, n, D]`, with the additive masks of `attention_masks`; → `[B, n, heads * D]` in the
    values' dtype (the softmax's normaliser is fp32 whatever the model's dtype).

    Nothing the size of the prefix is copied: query heads are grouped under the KV head they share instead
    of repeating K/V, and the softmax over prefix ⊕ new is computed in two parts sharing one shift and one
    normaliser instead of concatenating keys or scores. The prefix needs no gradient, so backward computes
    only the queries' share of its matmuls."""
    batch, heads, n, dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    prefix_bias, new_bias = masks
    new_bias = new_bias[:, :, None].expand(-1, -1, groups, -1, -1).reshape(-1, 1, groups * n, n)
    q = (q * scale).reshape(batch, kv_heads, groups * n, dim)

    def scores(keys: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        s = q @ keys.transpose(-1, -2)
        return s if bias is None else s + bias

    new_scores = scores(k, new_bias)
    if prefix_keys is None:
        out = new_scores.softmax(dim=-1, dtype=torch.float32).to(v.dtype) @ v
    else:  # weights are read in the values' dtype (exp of scores ≤ 0 is in [0, 1]); their sums are fp32
        prefix_scores = scores(prefix_keys, prefix_bias)
        shift = torch.maximum(prefix_scores.amax(-1, keepdim=True), new_scores.amax(-1, keepdim=True)).detach()
        prefix_weights = prefix_scores.sub_(shift.to(prefix_scores.dtype)).exp_()
        new_weights = new_scores.sub_(shift.to(new_scores.dtype)).exp_()
        total = prefix_weights.sum(-1, keepdim=True).float() + new_weights.sum(-1, keepdim=True).float()
        read = prefix_weights.to(prefix_values.dtype) @ prefix_values + new_weights.to(v.dtype) @ v
        out = (read / total).to(v.dtype)
    return out.view(batch, kv_heads, groups, n, dim).permute(0, 3, 1, 2, 4).reshape(batch, n, heads * dim)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class StopForward(Exception):
    """Raised inside the last needed layer so nothing after its K/V projection is computed."""


class RecordingCache(RaggedCache):
    """A cache for the model's own forward that records the new tokens' K/V and raises StopForward at the last
    layer needed; the prefix's entries (with their biases, and −inf on the padding of a batch of prefixes) are
    attended through the ragged attention function, never changed.

    The model's attention concatenates the prefix with the new tokens every layer, so this path copies the prefix;
    the direct path in `FrozenLM.forward_kv` avoids that and is used whenever the architecture allows."""

    def __init__(self, prefix: KVPrefix, last_layer: int, position: int):
        layers = []
        if not prefix.is_empty:
            biases = [None] * len(prefix.keys)
            if prefix.bias is not None or prefix.valid is not None:
                biases = prefix.layer_bias()
                if prefix.valid is not None:
                    blocked = ~prefix.valid.to(biases[0].device)[:, None, :]
                    biases = [b.masked_fill(blocked, float("-inf")) for b in biases]
            flat = prefix.flat or [None] * len(prefix.keys)
            for k, v, bias, f in zip(prefix.keys, prefix.values, biases, flat):
                layers.append(RaggedLayer(k, v, bias, f, position))
        super().__init__(layers)
        self.last_layer = last_layer
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys.append(key_states)
        self.values.append(value_states)
        if layer_idx == self.last_layer:
            raise StopForward
        if not self.layers:
            return key_states, value_states
        return self.layers[layer_idx].update(key_states, value_states)
