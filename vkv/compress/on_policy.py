"""On-policy attention matching (the reference's `compaction_methods/per_layer_head_on_policy.py`): layers are
compacted in order, and layer l's read-out queries are those the model computes when layers < l already read the
compacted entries, as it will after compaction; layer 0's are the plain read-out's.

The reference re-runs its query extraction once per layer. Here the read-out's tokens (the reconstruction pass's
requests and chunks) run through the decoder once, layer by layer (lm/layerwise.py): at layer l their queries are
taken, layer l is compacted with them, and the tokens then run layer l over the context before the span and the
compacted entries (their biases included) before going on. Queries of other sources (the span's own) stay as they
were, as the reference keeps its context-prefill queries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vkv.compress.compaction import Compaction, SpanReadout, compact_rows, concat
from vkv.compress.reconstruction import read_out_feeds
from vkv.compress.reference_queries import grouped
from vkv.lm.layerwise import LayerwisePass
from vkv.stages import stage


@dataclass
class FitOptions:
    """How each row is compacted (compaction.compact_rows' options)."""

    selection: str
    bias: str
    values: str
    ridge: float
    omp_step: int = 1


def read_out_pass(work, chunk: int) -> tuple[LayerwisePass, list[int]]:
    """The reconstruction pass's fed sequences, ready to run layer by layer, and where each one's piece of the span
    starts among its tokens."""
    span = list(work.ids[work.start : work.end])
    feeds = read_out_feeds(work.lm, span, work.start, chunk)
    positions = [torch.arange(len(fed)) + work.end for fed, _ in feeds]
    return LayerwisePass(work.lm, [fed for fed, _ in feeds], positions), [first for _, first in feeds]


def read_out_queries(stack: LayerwisePass, firsts: list[int], picked: torch.Tensor) -> torch.Tensor:
    """The current layer's queries of the repeated tokens `picked` (indices into the read-out's pieces, in order),
    under their KV heads and scaled: `[kv_heads, group * k, head_dim]`."""
    pieces = torch.cat([q[:, first:] for q, first in zip(stack.queries(), firsts)], dim=1)  # [heads, N, D]
    return grouped(stack.lm, pieces[:, picked.to(pieces.device)])


def compact_on_policy(
    work,
    keys: torch.Tensor,
    values: torch.Tensor,
    counts: torch.Tensor,
    picked: torch.Tensor,
    options: FitOptions,
    chunk: int,
    fixed: torch.Tensor | None = None,
    extra: torch.Tensor | None = None,
    on_layer: Callable[[int], None] | None = None,
) -> Compaction:
    """The span's compaction, layer by layer on the read-out's on-policy queries of tokens `picked` `[k]` (and
    `extra` `[layers, kv_heads, e, head_dim]` queries of other sources after them): `keys`, `values` `[layers,
    kv_heads, n, head_dim]` the span's own, `counts` `[layers, kv_heads]` the entries each head keeps (or `fixed`
    `[layers, kv_heads, c]` ones). Rows are layer-major, as `compact`'s. `on_layer(l)` after each layer."""
    lm = work.lm
    layers = keys.shape[0]
    stack, firsts = read_out_pass(work, chunk)
    prefix = lm.prefix(work.prefix_cache())
    parts = []
    for layer in range(layers):
        with stage("on-policy pass", lm.device):
            queries = read_out_queries(stack, firsts, picked)
        if extra is not None:
            queries = torch.cat([queries, extra[layer]], dim=1)
        readout = SpanReadout(queries, keys[layer], values[layer])
        part = compact_rows(
            readout,
            counts[layer],
            options.selection,
            options.bias,
            options.values,
            options.ridge,
            None if fixed is None else fixed[layer],
            options.omp_step,
        )
        parts.append(part)
        if layer + 1 < layers:
            with stage("on-policy pass", lm.device):
                stack.advance(*_layer_context(lm, prefix, layer, part, readout))
        if on_layer is not None:
            on_layer(layer)
    return concat(parts)


def _layer_context(lm, prefix, layer: int, part: Compaction, readout: SpanReadout):
    """What the read-out attends to at `layer`: the context before the span, then the span's compacted entries;
    keys and values `[1, kv_heads, L, head_dim]` and the bias `[1, kv_heads, L]` on the model's device."""
    keys = part.keys(readout)[None].to(lm.device, lm.dtype)
    values = part.values[None].to(lm.device, lm.dtype)
    bias = part.bias[None].to(lm.device)
    if prefix.is_empty:
        return keys, values, bias
    prefix_keys, prefix_values, prefix_bias = prefix.layer(layer)
    if prefix_bias is None:
        prefix_bias = torch.zeros(prefix_keys.shape[:3], device=lm.device)
    return (
        torch.cat([prefix_keys, keys], dim=2),
        torch.cat([prefix_values, values], dim=2),
        torch.cat([prefix_bias.expand(1, -1, -1), bias], dim=2),
    )
