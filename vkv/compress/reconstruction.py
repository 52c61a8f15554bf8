"""The question-free reconstruction pass (KVzip's trick): after the context, the model is asked to repeat the span
and reads it out again; the queries of that read-out attend to the span the way a request that needs the span
would. They score entries (KVzip: the most attention an entry receives) and serve as reference queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.lm.capture import projection_hooks
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM

REPEAT_REQUEST = "\n\nRepeat the previous context exactly.\n\n"


@dataclass
class ReconstructionPass:
    """The read-out of a span after the context it is compressed in (the verbatim conversation, or per turn the
    running compressed cache) and the repeat request. Rows are physical cache indices, positions logical ones."""

    span_rows: tuple[int, int]  # where the span's own entries sit among the fed rows
    queries: torch.Tensor  # [layers, heads, n, head_dim] pre-RoPE queries of the repeated span tokens
    positions: torch.Tensor  # [n] their logical positions
    query_rows: torch.Tensor  # [n] their rows among the fed rows (each sees the rows up to its own)
    keys: list[torch.Tensor]  # per layer [kv_heads, N_layer, head_dim] post-RoPE keys of the whole pass
    bias: list[torch.Tensor]  # per layer [kv_heads, N_layer] float32: every entry's bias (−inf on padding)
    fed: list[int]  # per layer, the row of `keys` where the fed rows start (after the context's own entries)

    @classmethod
    def run(cls, work) -> ReconstructionPass:
        """Feed the span, the request and the span again on top of `work.prefix_cache()`; record the read-out."""
        lm = work.lm
        prefix = work.prefix_cache()
        request = lm.tokenizer(REPEAT_REQUEST, add_special_tokens=False)["input_ids"]
        span = list(work.ids[work.start : work.end])
        fits = (lm.max_positions or 0) - prefix.next_position - len(request)  # span tokens the read-out leaves room for
        lm.check_positions(
            prefix.next_position + 2 * len(span) + len(request),
            f"the reconstruction pass (kvzip's scores, am's reconstruction queries) reads the span's {len(span)} "
            f"tokens again after it",
            f"spans of up to {max(0, fits // 2)} tokens fit after this context; compress this one in turns "
            "(--per-turn) or in shorter windows",
        )
        context = Context(lm, prefix)
        base, first = context.length, len(span) + len(request)  # read-out: fed tokens [first, first + n)
        with projection_hooks(lm, first, first + len(span), queries=True) as store:
            context.feed(span + request + span)
        layers = [layer.materialize() for layer in context.cache.layers]
        return cls(
            (base, base + len(span)),
            torch.stack(store["queries_pre_rope"]),
            torch.arange(len(span)).float() + prefix.next_position + first,
            torch.arange(len(span)) + base + first,
            [keys[0] for keys, _, _ in layers],
            [bias[0] for _, _, bias in layers],
            [layer.slots + layer.loaded for layer in context.cache.layers],
        )

    def scores(self, lm: FrozenLM) -> torch.Tensor:
        """KVzip's importance of each span entry `[layers, kv_heads, n]`: the largest attention it receives from any
        read-out query of any query head sharing its KV head (softmax over every entry that query sees, the
        context's entry biases included)."""
        group = lm.spec.num_heads // lm.spec.num_kv_heads
        out = []
        for layer, keys in enumerate(self.keys):
            q = lm.rotate(self.queries[layer].to(lm.device).float(), self.positions)  # [H, nq, D]
            k = keys.float().repeat_interleave(group, dim=0)  # [H, N, D]
            scores = q @ k.transpose(1, 2) * lm.spec.head_dim**-0.5
            scores += self.bias[layer].to(scores.device).repeat_interleave(group, dim=0)[:, None]
            fed = self.fed[layer]
            rows = self.query_rows.to(scores.device) + fed
            visible = torch.arange(k.shape[1], device=scores.device)[None, :] <= rows[:, None]
            span = slice(self.span_rows[0] + fed, self.span_rows[1] + fed)
            probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)[:, :, span]
            out.append(probs.amax(1).reshape(lm.spec.num_kv_heads, group, -1).amax(1))
        return torch.stack(out).cpu()

    def reference_queries(self, lm: FrozenLM, count: int) -> torch.Tensor:
        """`count` evenly spaced read-out queries per query head, post-RoPE at their positions and scaled by
        1/sqrt(head_dim), grouped under their KV head: `[layers, kv_heads, group * count, head_dim]`."""
        n = self.queries.shape[2]
        picked = torch.linspace(0, n - 1, min(count, n)).round().long().unique()
        layers, heads, _, dim = self.queries.shape
        kv_heads = lm.spec.num_kv_heads
        out = []
        for layer in range(layers):
            q = lm.rotate(self.queries[layer, :, picked].to(lm.device).float(), self.positions[picked]).cpu()
            out.append(q.reshape(kv_heads, heads // kv_heads * len(picked), dim) * dim**-0.5)
        return torch.stack(out)
