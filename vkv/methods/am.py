"""Attention matching: per layer and KV head, t of the span's keys with fitted biases and refitted values, so that
reference queries read the same from the span and give it the same share of attention (compress/compaction.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.compaction import SpanReadout, compact
from vkv.compress.head_budget import head_budget_setting
from vkv.compress.reconstruction import ReconstructionPass, chunk_setting
from vkv.compress.targets import attention_targets
from vkv.errors import VkvError
from vkv.kv.segment import Segment
from vkv.lm.capture import capture_span
from vkv.methods.base import PerTurnMethod
from vkv.methods.work import SpanWork
from vkv.settings import setting

QUERY_SOURCES = ("span", "reconstruction", "both")


@dataclass
class AttentionMatching(PerTurnMethod):
    """Zweiger et al. 2026, question-free: reference queries are the span's own (moved past the span) and/or those
    of a reconstruction pass; keys by attention or OMP; β by NNLS; values by ridge least squares. Defaults chosen on
    the dev split (evals/RESULTS.md, "The closed-form anchors on the dev split")."""

    name = "am"
    selection: str = setting("attention", "how each head's keys are chosen", ("attention", "omp"))
    bias: str = setting(
        "shared",
        "each kept entry's bias: shared, log(n / t) for every entry; fit, non-negative least squares on the reference "
        "queries' masses; none",
        ("shared", "fit", "none"),
    )
    values: str = setting("refit", "refit: ridge least squares; keep: the kept entries' own values", ("refit", "keep"))
    queries: str = setting("span", "where the reference queries come from", QUERY_SOURCES)
    num_queries: int = setting(
        512,
        "reference queries per query head and source, evenly spaced over the span (all of a shorter span's)",
        minimum=1,
    )
    ridge: float = setting(1e-2, "pulls refitted values toward the kept entries' own", minimum=0)
    head_budget: str = head_budget_setting()
    chunk: int = chunk_setting()

    def compress_to(self, work: SpanWork, budget: int, on_step=None) -> Segment:
        keys, values = work.span_kv()
        layers, kv_heads, n, dim = keys.shape
        queries = reference_queries(work, self.queries, self.num_queries, self.chunk)
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


def reference_queries(work: SpanWork, source: str, count: int, chunk: int) -> torch.Tensor:
    """`[layers, kv_heads, group * queries, head_dim]`, post-RoPE and scaled: the span's own queries moved past the
    span (what a request right after it asks first), a reconstruction pass's (read out in chunks of at most `chunk`
    tokens), or both."""
    parts = []
    if source in ("span", "both"):
        parts.append(work.reuse(("span queries", count), lambda: span_queries(work, count)))
    if source in ("reconstruction", "both"):
        parts.append(
            work.reuse(
                ("reconstruction queries", chunk, count),
                lambda: ReconstructionPass.run(work, chunk).reference_queries(work.lm, count),
            )
        )
    return torch.cat(parts, dim=2)


def span_queries(work: SpanWork, count: int) -> torch.Tensor:
    """The span's own queries moved past the span, `count` per query head (`reference_queries`' layout)."""
    acts = work.acts
    if acts.queries_pre_rope is None:
        acts, _ = capture_span(work.lm, work.ids[: work.end], work.start, work.end, queries=True)
    return attention_targets(work.lm, acts, torch.zeros(1), count).queries
