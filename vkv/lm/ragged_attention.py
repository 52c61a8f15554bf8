"""The attention function that reads a RaggedCache, registered with transformers' AttentionInterface.

A model whose attention implementation is `vkv_sdpa` (or `vkv_eager`) runs its usual attention whenever the keys it
is given come from any other cache (or none). When they come from a RaggedLayer (`update()` tags them), each query
attends, per KV head, to that head's own flat entries with their biases, to the dense entries with theirs, and to the
tokens fed since causally (with transformers' padding mask, if any): one softmax over all of them, grouped-query heads
sharing their KV head. The flat entries are padded to the layer's longest head in a temporary that lives for this
call only, so memory at rest stays the compressed size. Plain PyTorch: the same code on CPU and CUDA.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from vkv.errors import VkvError
from vkv.kv.ragged import RAGGED_TAG, RaggedLayer

MASKED = float("-inf")
SCORE_ELEMENTS = 2**26  # attention scores held at once (KV heads × folded query rows × entries): 256 MiB in float32


def eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Transformers' eager attention (softmax of scores plus the additive mask), for models loaded with `eager`."""
    group = query.shape[1] // key.shape[1]
    keys, values = repeat_kv(key, group), repeat_kv(value, group)
    scores = query @ keys.transpose(2, 3) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores = scores + attention_mask[..., : keys.shape[-2]]
    weights = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    return (weights @ values).transpose(1, 2).contiguous(), weights


# vkv's name → (the attention it runs on other caches, the implementation whose mask transformers builds for it)
IMPLEMENTATIONS = {
    "vkv_sdpa": (sdpa_attention_forward, "sdpa"),
    "vkv_eager": (eager_attention, "eager"),
}
BASE = {"sdpa": "vkv_sdpa", "eager": "vkv_eager"}  # what `use_ragged_attention` switches a model to


def ragged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Queries `[batch, heads, q, head_dim]` over a RaggedLayer (`key`/`value`: the tokens fed since it was built,
    the new ones last) → `[batch, q, heads, head_dim]`, no attention weights.

    The entries stay where they lie: the flat ones in one product of every KV head's queries with all heads' entries,
    each head's row masked to its own (`FlatHeads.head_bias`), the dense and fed ones in their own products; one
    softmax over the scores side by side. Nothing the layer holds is copied, so a decoding step costs the products;
    a long feed (a prefill or a read-out on a long cache) is attended a block of query rows at a time, so no
    tokens × entries matrix per head is held whole."""
    if module.training and dropout:
        raise VkvError("ragged attention is for decoding and scoring: dropout in training mode is not implemented")
    layer: RaggedLayer = getattr(key, RAGGED_TAG)
    batch, heads, q, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    rows = group * q  # the query heads of a KV head, folded into its query rows: (group, token) order
    folded = query.reshape(batch, kv_heads, rows, dim)
    scale = dim**-0.5 if scaling is None else scaling
    tail = _tail_mask(attention_mask, heads, group, q, layer.appended, torch.float32, folded.device)
    width = (layer.flat.keys.shape[0] if layer.flat is not None else 0) + layer.loaded + key.shape[-2]
    step = max(1, SCORE_ELEMENTS // (batch * kv_heads * width))  # rows whose scores are held at once
    out = torch.cat(
        [
            _attend_rows(
                layer,
                folded[:, :, lo : lo + step],
                key,
                value,
                None if tail is None else tail[..., lo : lo + step, :],
                scale,
            )
            for lo in range(0, rows, step)
        ],
        dim=2,
    )
    return out.view(batch, kv_heads, group, q, dim).permute(0, 3, 1, 2, 4).reshape(batch, q, heads, dim), None


def _attend_rows(layer: RaggedLayer, folded, key, value, tail, scale: float) -> torch.Tensor:
    """`ragged_attention` for some of the folded query rows `[batch, kv_heads, r, head_dim]` (`tail`: their rows of
    the mask) → `[batch, kv_heads, r, head_dim]`: one softmax over the flat, dense and fed entries side by side."""
    scores, values = [], []
    if layer.flat is not None:
        flat = layer.flat
        scores.append((folded @ flat.keys.to(folded.dtype).T).float() * scale + flat.head_bias()[None, :, None])
        values.append(flat.values.to(value.dtype))
    if layer.loaded:
        dense = (folded @ layer.keys.transpose(-1, -2)).float() * scale
        scores.append(dense if layer.bias is None else dense + layer.bias[:, :, None].float())
        values.append(layer.values)
    fed = (folded @ key.transpose(-1, -2)).float() * scale
    scores.append(fed if tail is None else fed + tail)
    values.append(value)
    weights = torch.cat(scores, dim=-1).softmax(dim=-1).to(value.dtype)
    out, start = None, 0
    for part, v in zip(scores, values):
        share = weights[..., start : start + part.shape[-1]] @ v
        out, start = (share if out is None else out + share), start + part.shape[-1]
    return out


def _tail_mask(
    attention_mask: torch.Tensor | None,
    heads: int,
    group: int,
    q: int,
    width: int,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor | None:
    """The additive mask `[batch or 1, 1 or kv_heads, group * q, width]` over the appended and new tokens, rows in
    folded order: transformers' mask (bool: True attends; or additive), or causal when it left causality to us
    (None). None: every row sees every column."""
    if attention_mask is None:
        if q == 1:
            return None
        allowed = torch.arange(width, device=device)[None, :] <= torch.arange(width - q, width, device=device)[:, None]
        mask = torch.zeros(q, width, dtype=dtype, device=device).masked_fill_(~allowed, MASKED)
        return mask.repeat(group, 1)[None, None]
    if attention_mask.dim() != 4 or attention_mask.shape[-1] != width or attention_mask.shape[1] not in (1, heads):
        raise VkvError(
            f"field attention_mask: a mask over a ragged cache is [batch, 1 or heads, queries, {width}] (the tokens "
            f"fed since it was built, then the new ones), not {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype == torch.bool:
        attention_mask = torch.zeros(attention_mask.shape, dtype=dtype, device=device).masked_fill_(
            ~attention_mask, MASKED
        )
    mask = attention_mask.to(dtype)
    if mask.shape[1] == 1:  # one mask for every head: repeat it over the group's folded rows
        return mask.expand(-1, group, -1, -1).reshape(mask.shape[0], 1, group * q, width)
    return mask.reshape(mask.shape[0], heads // group, group * q, width)


def attention_function(name: str):
    """The function registered as `name`: ragged attention on a RaggedLayer's keys, the base attention otherwise."""
    base = IMPLEMENTATIONS[name][0]

    def attention(module, query, key, value, attention_mask, **kwargs):
        layer = getattr(key, RAGGED_TAG, None)
        if layer is not None:
            keys = key.plain()
            setattr(keys, RAGGED_TAG, layer)
            return ragged_attention(module, query, keys, value, attention_mask, **kwargs)
        return base(module, query, key, value, attention_mask, **kwargs)

    return attention


def register() -> None:
    """Register vkv's implementations with transformers (idempotent)."""
    for name, (_, mask) in IMPLEMENTATIONS.items():
        AttentionInterface.register(name, attention_function(name))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[mask])


def use_ragged_attention(model) -> None:
    """Make a transformers model read RaggedCaches: its attention implementation becomes vkv's over the one it has
    (sdpa → vkv_sdpa, eager → vkv_eager), which runs exactly as before on any other cache."""
    register()
    current = model.config._attn_implementation
    if current in IMPLEMENTATIONS:
        return
    if current not in BASE:
        raise VkvError(
            f"field attn_implementation: a RaggedCache is read by vkv's attention over sdpa or eager, not {current!r}; "
            "load the model with attn_implementation='sdpa'"
        )
    model.set_attn_implementation(BASE[current])
