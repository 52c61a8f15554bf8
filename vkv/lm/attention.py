"""How much a range of query tokens attends to a range of key tokens, per layer and KV head.

Computed from captured queries and the cached keys instead of asking the model for attention weights,
which would materialise `[layers, heads, n, n]` for the whole window.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from vkv.errors import VkvError
from vkv.lm.frozen import FrozenLM


@contextmanager
def query_hooks(lm: FrozenLM, start: int, end: int) -> Iterator[list[torch.Tensor]]:
    """Record each layer's pre-RoPE queries `[heads, end-start, head_dim]` for positions [start, end)."""
    store: list[torch.Tensor] = []
    head_dim = lm.spec.head_dim

    def hook(_module, _inputs, output):
        rows = output.reshape(output.shape[0], output.shape[1], -1, head_dim)[0, start:end]
        store.append(rows.transpose(0, 1).detach().float())

    handles = []
    try:
        for attn in lm.attention_modules():
            handles.append((getattr(attn, "q_norm", None) or attn.q_proj).register_forward_hook(hook))
        yield store
    finally:
        for h in handles:
            h.remove()


def attention_to_span(lm: FrozenLM, ids: list[int], key_range: tuple[int, int], query_range: tuple[int, int]):
    """Attention `[layers, kv_heads, key_len]` from queries in query_range to keys in key_range, averaged over
    the query tokens and the query heads sharing each KV head (softmax over every key a query can see)."""
    ks, ke = key_range
    qs, qe = query_range
    if not (0 <= ks < ke <= qe and qs < qe <= len(ids)):
        raise VkvError(f"attention from tokens [{qs}, {qe}) to [{ks}, {ke}) is not a valid causal range")
    cache = lm.new_cache()
    with torch.no_grad(), query_hooks(lm, qs, qe) as queries:
        lm.decoder(torch.tensor([ids[:qe]]), cache)
    keys = [layer.keys[0] for layer in cache.layers]
    return attention_weights(lm, queries, torch.arange(qs, qe), keys, torch.arange(qe))[:, :, ks:ke]


def attention_weights(
    lm: FrozenLM,
    queries: list[torch.Tensor] | torch.Tensor,
    query_positions: torch.Tensor,
    keys: list[torch.Tensor],
    key_positions: torch.Tensor,
    key_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention `[layers, kv_heads, n_keys]` of pre-RoPE queries `[heads, nq, head_dim]` per layer (at
    `query_positions`) over post-RoPE keys `[kv_heads, n_keys, head_dim]` per layer (at `key_positions`), each
    query seeing the keys at or before its position; averaged over queries and the heads sharing a KV head.
    `key_bias` `[layers, kv_heads, n_keys]`: what compressed entries add to every query's logit (−inf: a padding
    slot), as the decoding cache adds it."""
    group = lm.spec.num_heads // lm.spec.num_kv_heads
    visible = key_positions[None, :] <= query_positions[:, None]  # [nq, n_keys]
    per_layer = []
    for layer, (q, k) in enumerate(zip(queries, keys)):
        q_rot = lm.rotate(q.float().to(lm.device), query_positions)  # [H, nq, D]
        k = k.float().to(lm.device).repeat_interleave(group, dim=0)
        scores = q_rot @ k.transpose(1, 2) / lm.spec.head_dim**0.5  # [H, nq, n_keys]
        if key_bias is not None:
            scores = scores + key_bias[layer].float().to(lm.device).repeat_interleave(group, dim=0)[:, None, :]
        scores = scores.masked_fill(~visible.to(scores.device), float("-inf"))
        probs = scores.softmax(-1).mean(1)  # [H, n_keys]
        per_layer.append(probs.reshape(lm.spec.num_kv_heads, group, -1).mean(1))
    return torch.stack(per_layer).cpu()
