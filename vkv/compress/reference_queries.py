"""Reference queries for attention matching and kvopt: the queries that stand in for future ones, per layer and KV
head, post-RoPE and scaled by 1/sqrt(head_dim), every query head of a group laid out under its KV head.

- `repeat`: the reconstruction pass's read-out (compress/reconstruction.py), every repeated token's query at its own
  read-out position: the reference's "repeat" self-study conversation (the context, "Repeat the previous context
  verbatim." and the context again as the answer);
- `span`: the span's own queries at their own positions (the reference's context-prefill); each attends to the whole
  span in the fit, later keys included, as there;
- `span-after`: the span's own queries moved to the position just after the span (what a request right after it
  asks first; vkv's earlier default);
- `repeat+span`: both, `repeat` first.

At most `cap` queries per KV head and source: a random subset of the tokens (seeded, the same for every layer, in
order), every query head of each, as the reference subsamples its 50,000.
"""

from __future__ import annotations

import torch

from vkv.compress.reconstruction import reconstruction_pass
from vkv.lm.capture import capture_span
from vkv.lm.frozen import FrozenLM
from vkv.settings import setting

QUERY_SOURCES = ("repeat", "span", "span-after", "repeat+span")
REFERENCE_CAP = 50_000  # the reference's query vectors per KV head


def source_setting():
    """The `queries` field, declared once for every method that fits on reference queries."""
    return setting(
        "repeat",
        "where the reference queries come from: repeat, the model reading the span out again; span, the span's own "
        "at their positions; span-after, the span's own moved past it; repeat+span",
        QUERY_SOURCES,
    )


def cap_setting(cap: int = REFERENCE_CAP):
    """The `max_queries` field, with the method's own default cap."""
    return setting(
        cap,
        "reference queries per KV head and source at most (every query head of a random subset of the tokens)",
        minimum=1,
    )


def token_subset(lm: FrozenLM, tokens: int, cap: int, seed: int) -> torch.Tensor:
    """Which of `tokens` tokens give reference queries, ascending `[k]`: all of them when their queries (every query
    head of a group) fit in `cap` per KV head, else a random subset that does (at least one token)."""
    group = lm.spec.num_heads // lm.spec.num_kv_heads
    keep = max(1, cap // group)
    if tokens <= keep:
        return torch.arange(tokens)
    return torch.randperm(tokens, generator=torch.Generator().manual_seed(seed))[:keep].sort().values


def grouped(lm: FrozenLM, queries: torch.Tensor) -> torch.Tensor:
    """Post-RoPE queries `[heads, k, head_dim]` → scaled, under their KV heads `[kv_heads, group * k, head_dim]`, float32
    on the model's device, where every fit on them runs."""
    heads, k, dim = queries.shape
    grouped = queries.to(lm.device, torch.float32).reshape(lm.spec.num_kv_heads, heads // lm.spec.num_kv_heads * k, dim)
    return grouped * dim**-0.5


def repeat_queries(work, chunk: int, cap: int) -> torch.Tensor:
    """The read-out's queries `[layers, kv_heads, group * k, head_dim]` at their own positions (module docstring)."""
    read_out = reconstruction_pass(work, chunk, score=False)
    picked = token_subset(work.lm, read_out.queries.shape[2], cap, work.seed)
    positions = read_out.positions[picked]
    return torch.stack(
        [grouped(work.lm, work.lm.rotate(q[:, picked].to(work.lm.device).float(), positions)) for q in read_out.queries]
    )


def span_queries(work, cap: int, after: bool) -> torch.Tensor:
    """The span's own queries `[layers, kv_heads, group * k, head_dim]`, at their own positions or, with `after`, all
    at the position just after the span."""
    acts = work.acts
    if acts.queries_pre_rope is None:
        acts, _ = capture_span(work.lm, work.ids[: work.end], work.start, work.end, queries=True)
    picked = token_subset(work.lm, acts.length, cap, work.seed)
    positions = torch.full((len(picked),), float(acts.end)) if after else picked.float() + acts.start
    return torch.stack(
        [
            grouped(work.lm, work.lm.rotate(q[:, picked].to(work.lm.device).float(), positions))
            for q in acts.queries_pre_rope
        ]
    )


def reference_queries(work, source: str, cap: int = REFERENCE_CAP, chunk: int = 2048) -> torch.Tensor:
    """`[layers, kv_heads, queries, head_dim]` from `source` (one of QUERY_SOURCES), at most `cap` per KV head and
    source; the read-out in chunks of at most `chunk` tokens."""
    parts = []
    if source in ("repeat", "repeat+span"):
        parts.append(repeat_queries(work, chunk, cap))
    if source in ("span", "span-after", "repeat+span"):
        after = source == "span-after"
        parts.append(work.reuse(("span queries", cap, after), lambda: span_queries(work, cap, after)))
    return torch.cat(parts, dim=2)
