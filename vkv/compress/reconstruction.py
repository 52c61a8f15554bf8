"""The question-free reconstruction pass (KVzip's trick): after the context, the model is asked to repeat the span
and reads it out again; the queries of that read-out attend to the span the way a request that needs the span
would. They score entries (KVzip: the most attention an entry receives) and serve as reference queries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.lm.capture import projection_hooks
from vkv.lm.frozen import FrozenLM

REPEAT_REQUEST = "\n\nRepeat the previous context exactly.\n\n"


@dataclass
class ReconstructionPass:
    """The read-out of span [start, end) after ids[:end] and the repeat request."""

    start: int
    end: int
    queries: torch.Tensor  # [layers, heads, n, head_dim] pre-RoPE queries of the repeated span tokens
    positions: torch.Tensor  # [n] their positions
    keys: list[torch.Tensor]  # per layer [kv_heads, N, head_dim] post-RoPE keys of the whole pass

    @classmethod
    def run(cls, lm: FrozenLM, ids: list[int], start: int, end: int) -> ReconstructionPass:
        request = lm.tokenizer(REPEAT_REQUEST, add_special_tokens=False)["input_ids"]
        sequence = list(ids[:end]) + request + list(ids[start:end])
        first = end + len(request)
        cache = lm.new_cache()
        with torch.no_grad(), projection_hooks(lm, first, len(sequence), queries=True) as store:
            lm.decoder(torch.tensor([sequence]), cache)
        queries = torch.stack(store["queries_pre_rope"])
        return cls(start, end, queries, torch.arange(first, len(sequence)).float(), [x.keys[0] for x in cache.layers])

    def scores(self, lm: FrozenLM) -> torch.Tensor:
        """KVzip's importance of each span entry `[layers, kv_heads, n]`: the largest attention it receives from any
        read-out query of any query head sharing its KV head (softmax over every key that query sees)."""
        group = lm.spec.num_heads // lm.spec.num_kv_heads
        out = []
        for layer, keys in enumerate(self.keys):
            q = lm.rotate(self.queries[layer].to(lm.device).float(), self.positions)  # [H, nq, D]
            k = keys.float().repeat_interleave(group, dim=0)  # [H, N, D]
            scores = q @ k.transpose(1, 2) * lm.spec.head_dim**-0.5
            visible = (
                torch.arange(k.shape[1], device=scores.device)[None, :] <= self.positions.to(scores.device)[:, None]
            )
            probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)[:, :, self.start : self.end]
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
