"""Capture what the frozen model computes for a span of tokens: per-layer V, pre-RoPE K and surprisal.

Hooks sit on each layer's value and key projections and keep only the requested span, so memory is
proportional to the span, not the window; they are removed when the context manager exits, even on error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from vkv.errors import VkvError
from vkv.lm.frozen import FrozenLM


@dataclass
class Activations:
    """What the model computed for tokens [start, end) of a sequence, on the CPU (targets are built there)."""

    values: torch.Tensor  # [layers, kv_heads, span, head_dim]
    keys_pre_rope: torch.Tensor  # [layers, kv_heads, span, head_dim]
    surprisal: torch.Tensor  # [span], nats; -log p(token | prefix); NaN for a sequence's first token
    start: int
    end: int
    queries_pre_rope: torch.Tensor | None = None  # [layers, heads, span, head_dim] when asked for

    @property
    def length(self) -> int:
        return self.end - self.start

    def slice(self, start: int, end: int) -> Activations:
        """The activations of tokens [start, end) ⊆ [self.start, self.end)."""
        lo, hi = start - self.start, end - self.start
        queries = None if self.queries_pre_rope is None else self.queries_pre_rope[:, :, lo:hi]
        return Activations(
            self.values[:, :, lo:hi], self.keys_pre_rope[:, :, lo:hi], self.surprisal[lo:hi], start, end, queries
        )


@contextmanager
def projection_hooks(
    lm: FrozenLM, start: int, end: int, queries: bool = False
) -> Iterator[dict[str, list[torch.Tensor]]]:
    """Record each layer's V and pre-RoPE K (and Q) for positions [start, end) of the next forward pass."""
    store: dict[str, list[torch.Tensor]] = {"values": [], "keys_pre_rope": [], "queries_pre_rope": []}
    head_dim = lm.spec.head_dim

    def recorder(kind: str):
        def hook(_module, _inputs, output):
            batch, seq = output.shape[0], output.shape[1]
            per_head = output.reshape(batch, seq, -1, head_dim)[0, start:end]  # [span, kv_heads, head_dim]
            store[kind].append(per_head.transpose(0, 1).detach().float().cpu())

        return hook

    handles = []
    try:
        for attn in lm.attention_modules():
            key_module = getattr(attn, "k_norm", None) or attn.k_proj  # pre-RoPE K is after any key norm
            handles.append(attn.v_proj.register_forward_hook(recorder("values")))
            handles.append(key_module.register_forward_hook(recorder("keys_pre_rope")))
            if queries:
                query_module = getattr(attn, "q_norm", None) or attn.q_proj
                handles.append(query_module.register_forward_hook(recorder("queries_pre_rope")))
        yield store
    finally:
        for h in handles:
            h.remove()


LOGIT_ROWS = 1024  # positions whose logits over the vocabulary are held at once


def capture_span(
    lm: FrozenLM, ids: torch.Tensor | list[int], start: int, end: int, keep_cache: bool = False, queries: bool = False
):
    """One forward pass over ids[:end]; returns (Activations for [start, end), the KV cache or None).

    With keep_cache the DynamicCache of all `end` tokens is returned too (crop it to `start` for a prefix);
    with queries the span's pre-RoPE queries are kept as well (for attention-output targets).
    """
    ids_t = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    if not 0 <= start < end <= ids_t.numel():
        raise VkvError(f"span [{start}, {end}) is empty or outside the {ids_t.numel()} tokens given")
    input_ids = ids_t[:end].unsqueeze(0).to(lm.device)
    first = max(start - 1, 0)  # the position whose logits predict the span's first token
    lm.check_prefill(end, min(end - first, LOGIT_ROWS), f"a forward pass over {end} tokens")
    cache = lm.new_cache() if keep_cache else None
    with torch.no_grad(), projection_hooks(lm, start, end, queries) as store:
        decoder = lm.model.get_decoder()
        hidden = decoder(input_ids=input_ids, **lm.with_cache(cache), use_cache=keep_cache).last_hidden_state
        surprisal = _surprisal(lm.model.get_output_embeddings(), hidden[0, first:end], input_ids[0], start, end)
    acts = Activations(
        values=torch.stack(store["values"]),
        keys_pre_rope=torch.stack(store["keys_pre_rope"]),
        surprisal=surprisal,
        start=start,
        end=end,
        queries_pre_rope=torch.stack(store["queries_pre_rope"]) if queries else None,
    )
    return acts, cache


def _surprisal(head: torch.nn.Module, hidden: torch.Tensor, ids: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """-log p(ids[t] | ids[:t]) for t in [start, end), from the last hidden states `hidden` of positions
    max(start-1,0)..end-1 through the output `head`, LOGIT_ROWS positions at a time: a long span's logits over the
    whole vocabulary are never held at once."""
    targets = ids[max(start, 1) : end]
    nll = []
    for lo in range(0, len(targets), LOGIT_ROWS):
        logp = torch.log_softmax(head(hidden[lo : lo + LOGIT_ROWS]).float(), dim=-1)
        nll.append(-logp.gather(-1, targets[lo : lo + LOGIT_ROWS, None])[:, 0])
    nll = torch.cat(nll) if nll else hidden.new_zeros(0, dtype=torch.float32)
    if start == 0:
        nll = torch.cat([torch.full((1,), float("nan"), device=nll.device), nll])
    return nll.cpu()
