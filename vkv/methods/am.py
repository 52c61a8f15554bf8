"""Attention matching: per layer and KV head, t of the span's keys with fitted biases and refitted values, so that
reference queries read the same from the span and give it the same share of attention (compress/compaction.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.compaction import SpanReadout, compact
from vkv.compress.reconstruction import ReconstructionPass
from vkv.compress.targets import attention_targets
from vkv.errors import VkvError
from vkv.kv.segment import Segment
from vkv.lm.capture import capture_span
from vkv.methods.base import BudgetMethod, SpanWork

QUERY_SOURCES = ("span", "reconstruction", "both")


@dataclass
class AttentionMatching(BudgetMethod):
    """Zweiger et al. 2026, question-free: reference queries are the span's own (moved past the span) and/or those
    of a reconstruction pass; keys by attention or OMP; β by NNLS; values by ridge least squares."""

    name = "am"
    selection: str = "attention"  # or "omp"
    bias: str = "shared"  # log(n / t) for every entry; "fit": NNLS on the reference queries' masses; or "none".
    # Chosen on the dev split (evals/RESULTS.md, issue 18): shared beat fit by +0.075 [+0.043, +0.106] retention at 3.2×
    values: str = "refit"  # or "keep" (the kept entries' own values)
    queries: str = "span"  # or "reconstruction" or "both"
    # per query head and source, evenly spaced over the span (all of a shorter span's tokens). Chosen on the dev split
    # (evals/RESULTS.md, issue 18): 512 beat 128 by +0.227 [+0.170, +0.292] retention at 3.2x; 32 lost 0.098
    num_queries: int = 512
    ridge: float = 1e-2  # pulls refitted values toward the kept entries' own
    # AdaKV's split of the layer's budget over its KV heads; "uniform": each head its own t keys; "shared": the same
    # tokens. Chosen on the dev split: adaptive beat uniform by +0.055 [+0.020, +0.103] retention at 3.2x.
    head_budget: str = "adaptive"

    def check(self) -> None:
        if self.queries not in QUERY_SOURCES:
            raise VkvError(
                f"am: field queries: unknown value '{self.queries}'; choose one of {', '.join(QUERY_SOURCES)}"
            )

    def compress_to(self, work: SpanWork, budget: int) -> Segment:
        keys, values = work.span_kv()
        layers, kv_heads, n, dim = keys.shape
        queries = reference_queries(work, self.queries, self.num_queries)
        readout = SpanReadout.per_head(queries, keys, values)
        try:
            result = compact(
                readout,
                budget,
                self.selection,
                self.bias,
                self.values,
                self.ridge,
                head_budget=self.head_budget,
                kv_heads=kv_heads,
            )
        except ValueError as exc:
            raise VkvError(f"am: {exc}") from None
        shape = (layers, kv_heads, -1)
        return work.keep_per_head(
            result.index.reshape(shape),
            result.values.reshape(layers, kv_heads, -1, dim),
            result.bias.reshape(shape),
            None if bool(result.real.all()) else result.real.reshape(shape),
            reference_queries=queries.shape[2],
        )


def reference_queries(work: SpanWork, source: str, count: int) -> torch.Tensor:
    """`[layers, kv_heads, group * queries, head_dim]`, post-RoPE and scaled: the span's own queries moved past the
    span (what a request right after it asks first), a reconstruction pass's, or both."""
    parts = []
    if source in ("span", "both"):
        acts = work.acts
        if acts.queries_pre_rope is None:
            acts, _ = capture_span(work.lm, work.ids[: work.end], work.start, work.end, queries=True)
        parts.append(attention_targets(work.lm, acts, torch.zeros(1), count).queries)
    if source in ("reconstruction", "both"):
        parts.append(ReconstructionPass.run(work).reference_queries(work.lm, count))
    return torch.cat(parts, dim=2)
