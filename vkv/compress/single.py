"""Virtual tokens for one span (or for the tokens of it a shared verbatim part leaves), beside a per-head verbatim
part: the virtual part every vkv recipe builds (compress/recipe.py decides which verbatim part sits beside it).

Pooled targets over the span's blocks are matched by optimising k virtual embeddings on top of the prefix; each KV
head's verbatim share (kvzip's best entries, or am's compaction given as a `Verbatim`) and its share of the virtual
tokens are set by their biases, and the two join as one compact segment.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from vkv.compress.attention_matching import AttentionMatchingFit
from vkv.compress.autoratio import record_loss
from vkv.compress.config import CompressConfig
from vkv.compress.distill import build_probes, distill, trace_summary
from vkv.compress.head_budget import per_head_index
from vkv.compress.head_hybrid import HeadSplit, Verbatim, head_hybrid_bias, reached
from vkv.compress.optimise import optimise
from vkv.compress.problem import SpanProblem
from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.kv.flat import MASKED
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, interleaved, verbatim_segment
from vkv.lm.capture import capture_span
from vkv.lm.frozen import FrozenLM
from vkv.lm.rebuild import virtual_kv
from vkv.stages import stage


def virtual_segment(
    lm: FrozenLM,
    ids: list[int],
    acts,
    prefix: KVPrefix,
    config: CompressConfig,
    budget: int,
    message_starts: list[int] | None = None,
    attention: torch.Tensor | None = None,
    on_step: Callable[[int, float], None] | None = None,
    teacher: KVPrefix | None = None,
    token_scores: torch.Tensor | None = None,
    span_kv: KVPrefix | None = None,
    verbatim: Verbatim | None = None,
    shared: torch.Tensor | None = None,
) -> Segment:
    """Optimise virtual tokens standing for ids[acts.start:acts.end] on top of `prefix`, `budget` entries per KV head
    (`span_budget`) beside each head's verbatim share; `config` a validated recipe (`CompressConfig.validate`). With a
    distillation stage, `teacher` holds the full-context K/V of ids[:acts.end] (computed here when not given);
    `token_scores` `[layers, kv_heads, span]`: the reconstruction pass's importance of the span's tokens, when the
    recipe ranks the heads' shares by it; `span_kv`: the span's own K/V as the cache will hold them (the verbatim
    entries of a per-head hybrid, where kvzip's choice keeps them); `verbatim`: a per-head hybrid's verbatim part chosen and
    fitted by another method (`verbatim_source`), instead of the span's best entries as they are; `shared` `[s]`: the
    span-relative tokens every head keeps verbatim (their entries already in `prefix`): the virtual tokens, and each
    head's own entries, then come from the rest of the span, and with a per-head share the shared entries join the
    segment. The segment records the virtual tokens' V loss against their targets."""
    start, end = acts.start, acts.end
    started = time.perf_counter()
    split = HeadSplit.of(budget, _check_recipe(config, verbatim, shared))
    rest = None if shared is None else complement(shared, end - start)
    if split.verbatim:  # each head's share does not depend on the embeddings: known before any stage tunes them
        verbatim = verbatim or _best_entries(span_kv, token_scores, split, config, shared, rest)
    if not split.virtual:  # a one-entry budget that keeps its entry verbatim: no virtual token to tune
        return _kept_verbatim(verbatim, start, split, started)
    available = end - start if rest is None else len(rest)
    k = config.virtual_tokens(split.virtual, available)
    problem = SpanProblem.build(lm, ids, acts, k, config, message_starts, attention, rest, token_scores)
    positions = problem.positions
    if split.verbatim:
        kept = verbatim.kept if rest is None else verbatim.kept[:, :, rest]
        rule, proportional, offset = config.head_budget, config.proportional_attention, config.virtual_offset
        virtual = head_hybrid_bias(problem.token_scores, problem.blocks, split, rule, proportional, offset, kept)
    built = time.perf_counter()
    with stage("steps", lm.device):
        result = optimise(lm, prefix, problem.targets, positions, config.optim, on_step=on_step)
    embeddings, stats = result.embeddings, result.summary()
    if config.distill.steps:
        if teacher is None:
            _, cache = capture_span(lm, torch.tensor(ids[:end]), start, end, keep_cache=True)
            teacher = KVPrefix.from_cache(cache)
        beside = None
        if split.verbatim:
            own = verbatim.span_kv
            beside = (KVPrefix(own.keys, own.values, None, [b[None] for b in verbatim.bias]), virtual)
        embeddings = _distilled(lm, ids, (start, end), teacher, prefix, embeddings, positions, config, stats, beside)
    stats["phase_seconds"] = {  # where the time went: pooled targets (and a per-head hybrid's shares), the span's
        # read-out queries, the optimiser (and distillation); virtual_part adds the K/V and the biases
        "targets": round(built - started - problem.readout_seconds, 4),
        "readout": round(problem.readout_seconds, 4),
        "optimise": round(time.perf_counter() - built, 4),
    }
    segment = virtual_part(lm, prefix, problem, (start, end), embeddings, stats, config, budget, not split.verbatim)
    if split.verbatim:
        stats["verbatim_per_head"] = split.verbatim
        segment = beside_verbatim(segment, verbatim.span_kv, verbatim.bias, virtual)
    return segment


def _best_entries(span_kv, token_scores, split: HeadSplit, config: CompressConfig, shared, rest) -> Verbatim:
    """kvzip's verbatim part: each head's `split.verbatim` best own entries by `token_scores` `[layers, kv_heads, n]`
    (spread over the heads by the recipe's head budget) as they are, among the `rest` beside `shared` tokens every
    head keeps (then the shared ones join each head's)."""
    if span_kv is None:
        raise VkvError("a per-head verbatim share of the span's own entries needs their K/V (span_kv)")
    scores = token_scores if rest is None else token_scores[:, :, rest]
    kept = reached(*per_head_index(scores, split.verbatim, config.head_budget), scores.shape[-1])
    own = torch.zeros(kept.shape).masked_fill(~kept, MASKED)
    return Verbatim(span_kv, own if shared is None else with_shared(own, shared, rest))


def _check_recipe(config: CompressConfig, verbatim: Verbatim | None, shared: torch.Tensor | None) -> float:
    """Refuse a recipe not validated, or a verbatim part the recipe does not choose so; the recipe's per-head share."""
    if config.verbatim_share is None or config.verbatim_source is None:
        raise VkvError("virtual tokens need a validated recipe: CompressConfig.validate() fills its defaults")
    if (verbatim is None) != (config.verbatim_source == "kvzip"):
        raise VkvError(
            f"field verbatim_source: a {config.verbatim_source} recipe's verbatim part is fitted on the span before "
            "the virtual tokens (fitted_verbatim), and this call gave "
            + ("none" if verbatim is None else "one for a recipe that keeps the span's own entries")
        )
    if shared is not None and (verbatim is not None or config.distill.steps):
        raise VkvError(
            "beside shared verbatim tokens, "
            + ("am's compaction" if verbatim is not None else "the distillation stage (distill_steps)")
            + " is not implemented (it runs on a whole span); use verbatim_source kvzip and distill_steps 0"
        )
    return config.verbatim_share


def complement(kept: torch.Tensor, n: int) -> torch.Tensor:
    """The span-relative indices `[n - len(kept)]`, ascending, of the tokens not in `kept`."""
    mask = torch.ones(n, dtype=torch.bool)
    mask[kept] = False
    return mask.nonzero()[:, 0]


def with_shared(own: torch.Tensor, shared: torch.Tensor, rest: torch.Tensor) -> torch.Tensor:
    """Each head's own-entry biases over the whole span `[layers, kv_heads, n]`: `own` `[layers, kv_heads, rest]` on
    the `rest` tokens, 0 on the `shared` ones every head keeps."""
    layers, heads, _ = own.shape
    dense = torch.full((layers, heads, len(shared) + len(rest)), MASKED)
    dense[..., rest] = own.float()
    dense[..., shared] = 0.0
    return dense


def virtual_part(
    lm: FrozenLM,
    prefix: KVPrefix,
    problem: SpanProblem,
    span: tuple[int, int],
    embeddings: torch.Tensor,
    stats: dict,
    config: CompressConfig,
    budget: int,
    biased: bool = True,
) -> Segment:
    """Tuned virtual tokens (`embeddings` `[k, hidden]` at `problem.positions`) on top of `prefix` as a segment standing
    for the problem's `span`: their K/V, their biases (`problem.bias`; none when not `biased`, where a per-head hybrid
    sets its own) and, in `stats`, their V loss against the targets and the seconds the K/V and the biases took. Both
    hybrids build their virtual part here and join it to their verbatim entries with `interleaved`."""
    started = time.perf_counter()
    keys, values = virtual_kv(lm, embeddings, problem.positions, prefix)
    kv_done = time.perf_counter()
    bias, separable = problem.bias(config, keys, budget) if biased else (None, None)
    phases = stats.setdefault("phase_seconds", {})
    phases.update(kv=round(kv_done - started, 4), bias=round(time.perf_counter() - kv_done, 4))
    segment = Segment("virtual", span, keys, values, problem.positions, embeddings, stats, bias, separable)
    return record_loss(segment, values, problem.targets)


def _kept_verbatim(verbatim: Verbatim, start: int, split: HeadSplit, started: float) -> Segment:
    """A per-head hybrid whose budget holds no virtual token: each head's verbatim part alone, as a compact segment.
    There is no V loss to measure, so its loss is None (auto_ratio does not choose it)."""
    segment = verbatim_segment(verbatim.span_kv, start)
    segment.bias = verbatim.bias.float().cpu()
    seconds = time.perf_counter() - started
    segment.stats = dict(
        verbatim_per_head=split.verbatim,
        virtual_per_head=0,
        loss=None,
        per_layer_loss=None,
        steps=0,
        stopped="no virtual token",
        seconds=seconds,
        seconds_per_step=0.0,
        phase_seconds={"targets": round(seconds, 4)},
    )
    return segment.compacted()


def _distilled(lm, ids, span, teacher, prefix, embeddings, positions, config, stats, beside=None) -> torch.Tensor:
    """The embeddings after the distillation stage; its KL trace goes into `stats`. `beside`: a per-head hybrid's
    verbatim entries (their bias masking what each head does not hold) and the virtual tokens' bias per head."""
    start, end = span
    probes = build_probes(lm, ids, end, teacher, config.distill, start)
    fixed, bias = beside or (None, None)
    embeddings, trace = distill(lm, prefix, embeddings, positions, end, probes, config.distill, fixed, bias)
    stats["distill"] = trace_summary(probes, trace)
    return embeddings


def beside_verbatim(virtual: Segment, span_kv: KVPrefix, own_bias: torch.Tensor, bias: torch.Tensor) -> Segment:
    """The span's own entries (`span_kv`, batch 1) and the `virtual` segment's, each head reaching those its biases
    (`own_bias` `[layers, kv_heads, n]`, `bias` `[layers, kv_heads, k]`) do not mask, as one compact segment: each
    head's slots hold only what it reaches, so the segment's memory is what the ratio counts (most of a span's own
    entries are reached by some head, so one slot per own entry would hold nearly the whole span)."""
    own = verbatim_segment(span_kv, virtual.span[0])
    own.bias, virtual = own_bias, dataclasses.replace(virtual, embeddings=None, bias=bias, separable=None)
    return interleaved(own, virtual)[0].compacted()


def fitted_verbatim(work: SpanWork, config: CompressConfig, budget: int) -> Verbatim | None:
    """A per-head hybrid's verbatim part fitted by another method on the work's span or turn (`verbatim_source`): am's
    compaction at the verbatim share of `budget`, its entries spread over the heads by the recipe's own head budget
    (the rule the virtual share follows too); None where each head keeps the span's own entries (kvzip). `config`: a
    validated recipe."""
    if config.verbatim_source != "am":
        return None
    fit = AttentionMatchingFit(head_budget=config.head_budget)
    compaction, _ = fit.compaction(work, HeadSplit.of(budget, config.verbatim_share).verbatim)
    return Verbatim.fitted(*work.span_kv(), compaction)
