"""What the virtual tokens are optimised towards: pooled per-layer V (and optionally K) of a span, and
optionally what later queries read from the span (attention outputs and log-normalisers per layer)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.compaction import SpanReadout, compact
from vkv.compress.head_budget import HeadBudget
from vkv.compress.pooling import Blocks, pool
from vkv.errors import VkvError
from vkv.lm.capture import Activations
from vkv.lm.frozen import FrozenLM


@dataclass(frozen=True)
class TargetKind:
    """What a target kind matches besides the pooled V, and what that asks of the rest of the pipeline."""

    name: str
    keys: str | None = None  # "pre-rope" or "post-rope": pooled keys are matched too, in that frame
    read_out: bool = False  # what reference queries read from the span (needs the span's queries captured)
    order_free: bool = True  # built from which tokens a block holds, not where they sit (hybrid may pool it)
    compaction: HeadBudget | None = None  # K and V are attention matching's entries, chosen with this head budget

    @property
    def rope_keys(self) -> bool:
        """Whether the optimiser compares post-RoPE keys (the model's own) rather than pre-RoPE ones."""
        return self.keys != "pre-rope"

    @property
    def uses_keys(self) -> bool:
        return self.keys is not None or self.read_out

    @property
    def needs_queries(self) -> bool:
        return self.read_out or self.compaction is not None


TARGET_KINDS: dict[str, TargetKind] = {
    kind.name: kind
    for kind in (
        TargetKind("v"),
        TargetKind("kv-pre-rope", keys="pre-rope"),
        TargetKind("kv-post-rope", keys="post-rope", order_free=False),  # the recipe's Failure 2
        TargetKind("v+attention", read_out=True, order_free=False),
        # slot j matches, per layer and KV head, am's j-th compacted key (post-RoPE) and refitted value:
        # the same kept tokens in every head (what one input embedding per slot can produce), or each head its own
        TargetKind("am", keys="post-rope", order_free=False, compaction=HeadBudget.SHARED),
        TargetKind("am-per-head", keys="post-rope", order_free=False, compaction=HeadBudget.UNIFORM),
    )
}


def target_kind(name: str) -> TargetKind:
    if name not in TARGET_KINDS:
        raise VkvError(f"unknown target '{name}'; choose one of {', '.join(TARGET_KINDS)}")
    return TARGET_KINDS[name]


ATTENTION_QUERIES = 128  # reference queries per head: enough to pin the block's read-out, cheap next to the forward


@dataclass
class AttentionTargets:
    """What a query arriving right after the span reads from it, per layer and KV head.

    Reference queries are the span's own queries (question-free), moved to the position just after the span;
    each sees the whole span. The virtual tokens must give each query the same read-out (`outputs`) and the
    same total attention logit mass (`log_norm`), so that mixing with the prefix and later tokens is unchanged.
    Query heads sharing a KV head are laid out as one query axis of length group * n, as `model.attend` does.
    """

    queries: torch.Tensor  # [layers, kv_heads, group * n, head_dim] post-RoPE, already scaled by 1/sqrt(head_dim)
    outputs: torch.Tensor  # [layers, kv_heads, group * n, head_dim]
    log_norm: torch.Tensor  # [layers, kv_heads, group * n] logsumexp of the scores over the span's keys
    log_mass: torch.Tensor  # [k] added to each virtual token's logits (log of its block size, or zeros)
    weight: float = 1.0  # of the read-out error, relative to the V loss

    @property
    def count(self) -> int:
        return self.queries.shape[2]


@dataclass
class Targets:
    """Pooled targets for k virtual tokens standing for original tokens [start, end)."""

    kind: str
    start: int
    end: int
    blocks: Blocks
    weights: torch.Tensor  # [span] pooling weights, summing to 1 within each block
    values: torch.Tensor  # [layers, kv_heads, k, head_dim]
    value_scale: torch.Tensor  # [layers] variance of the original span's V: makes every layer count equally
    keys: torch.Tensor | None  # [layers, kv_heads, k, head_dim], pre- or post-RoPE by kind; None for "v"
    key_scale: torch.Tensor | None  # [layers]
    pooled_embeddings: torch.Tensor  # [k, hidden] the same weights applied to the token embeddings
    attention: AttentionTargets | None = None  # for kind "v+attention"

    @property
    def k(self) -> int:
        return self.blocks.count

    @property
    def spec(self) -> TargetKind:
        return TARGET_KINDS[self.kind]


def build_targets(
    lm: FrozenLM,
    ids: torch.Tensor,
    acts: Activations,
    blocks: Blocks,
    weights: torch.Tensor,
    kind: str = "v",
    proportional_attention: bool = True,
    attention_queries: int = ATTENTION_QUERIES,
    attention_weight: float = 1.0,
) -> Targets:
    spec = target_kind(kind)
    keys = key_scale = attention = None
    with torch.no_grad():
        span_embeddings = lm.embed(ids[acts.start : acts.end]).float().cpu()
    if spec.read_out:
        sizes = blocks.sizes()
        log_mass = sizes.log() if proportional_attention else torch.zeros_like(sizes)
        attention = attention_targets(lm, acts, log_mass, attention_queries, attention_weight)
    if spec.compaction is not None:
        keys, values, kept = compaction_targets(lm, acts, blocks.count, spec.compaction)
        key_scale = _per_layer_variance(keys)
        pooled_embeddings = span_embeddings[kept]  # each slot starts as the token am keeps there most often
    else:
        values = pool(acts.values, blocks, weights, dim=2)
        pooled_embeddings = pool(span_embeddings, blocks, weights, dim=0)
    if spec.compaction is None and spec.keys is not None:
        original_keys = acts.keys_pre_rope
        if spec.keys == "post-rope":  # averages keys rotated to different positions
            original_keys = lm.rotate(original_keys, torch.arange(acts.start, acts.end))
        keys = pool(original_keys, blocks, weights, dim=2)
        key_scale = _per_layer_variance(original_keys)
    return Targets(
        kind=kind,
        start=acts.start,
        end=acts.end,
        blocks=blocks,
        weights=weights,
        values=values,
        value_scale=_per_layer_variance(acts.values),
        keys=keys,
        key_scale=key_scale,
        pooled_embeddings=pooled_embeddings,
        attention=attention,
    )


def attention_targets(
    lm: FrozenLM, acts: Activations, log_mass: torch.Tensor, num_queries: int, weight: float = 1.0
) -> AttentionTargets:
    """`AttentionTargets` from `num_queries` evenly spaced tokens of the span (every head of each)."""
    if acts.queries_pre_rope is None:
        raise VkvError("attention targets need the span's queries; capture the span with queries=True")
    if num_queries < 1:
        raise VkvError(f"attention targets need at least one reference query, got {num_queries}")
    if not weight >= 0:
        raise VkvError(f"the attention read-out weight must be ≥ 0, got {weight}")
    picked = torch.linspace(0, acts.length - 1, min(num_queries, acts.length)).round().long().unique()
    layers, heads, _, dim = acts.queries_pre_rope.shape
    kv_heads = acts.values.shape[1]
    after_span = torch.full((len(picked),), float(acts.end))
    key_positions = torch.arange(acts.start, acts.end, dtype=torch.float32)
    queries, outputs, log_norms = [], [], []
    for layer in range(layers):  # one layer at a time: scores are [kv_heads, group * n, span]
        q = lm.rotate(acts.queries_pre_rope[layer, :, picked].to(lm.device), after_span).float().cpu()
        q = q.reshape(kv_heads, heads // kv_heads * len(picked), dim) * dim**-0.5
        keys = lm.rotate(acts.keys_pre_rope[layer].to(lm.device), key_positions).float().cpu()
        scores = q @ keys.transpose(-1, -2)
        queries.append(q)
        log_norms.append(scores.logsumexp(-1))
        outputs.append(scores.softmax(-1) @ acts.values[layer])
    return AttentionTargets(torch.stack(queries), torch.stack(outputs), torch.stack(log_norms), log_mass, weight)


def compaction_targets(
    lm: FrozenLM, acts: Activations, k: int, head_budget: HeadBudget
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention matching's k entries for the span (top-attention keys, shared bias, refitted values from
    ATTENTION_QUERIES reference queries, the count these targets were measured with (evals/RESULTS.md, 'Virtual
    tokens against the anchors'); `head_budget` shared or
    uniform): keys (post-RoPE) and values `[layers, kv_heads, k, head_dim]`, and per
    slot the span-relative token kept there by the most heads `[k]`."""
    layers, kv_heads, n, dim = acts.values.shape
    positions = torch.arange(acts.start, acts.end, dtype=torch.float32)
    keys = torch.stack([lm.rotate(k.to(lm.device), positions).float().cpu() for k in acts.keys_pre_rope])
    queries = attention_targets(lm, acts, torch.zeros(1), ATTENTION_QUERIES).queries
    readout = SpanReadout.per_head(queries, keys, acts.values)
    result = compact(
        readout, k, "mean", bias="shared", values="refit", ridge=1e-2, kv_heads=kv_heads, head_budget=head_budget
    )
    shape = (layers, kv_heads, k, dim)
    return result.keys(readout).reshape(shape), result.values.reshape(shape), result.index.mode(dim=0).values


def _per_layer_variance(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1).var(dim=1).clamp_min(1e-8)
