"""Peak memory of each compression method, planned from a model config: arithmetic that follows what each method's
code allocates, stage by stage, not a measurement (`vkv bench compress` measures).

Every method holds the weights and the window's KV cache, and on top of them one stage at a time:

- prefill: the decoder's forward over the window (lm/capture.py), its surprisal logits a block of LOGIT_ROWS
  positions at a time; the span's V and pre-RoPE K go to the host in float32;
- read-out (compress/reconstruction.py): each chunk of the span, after its request, fed on top of a device copy of the
  whole span's cache (the ragged cache it extends); the attention's float32 scores of a block of query rows (within
  the ragged attention's SCORE_ELEMENTS), their concatenation and softmax, or one layer's MLP, or the chunk's logits, whichever is largest; then the scores, a block of queries
  within SCORE_ELEMENTS at a time, against float32 keys repeated over the query heads. Its queries are kept on the
  host in float32, every layer's;
- am (compress/attention_matching.py, compaction.py, on_policy.py): the span's K/V in float32 and the reference
  queries `[layers, kv_heads, m, head_dim]` float32 on the device, per-layer statistics within SCORE_ELEMENTS, then
  the read-out run layer by layer (lm/layerwise.py: every chunk's hidden states and one layer's projections at once)
  with each layer fitted on its on-policy queries: score blocks within SCORE_ELEMENTS (float32) and normal equations
  within GRAM_ELEMENTS (float32, factorised in float64), or one row's own when it is wider;
- kvopt (compress/kvopt.py, methods/kvopt.py): am's queries (capped lower), each layer's read-outs, Adam on the free
  keys, values and biases, then the distillation stage: the model's forward and backward over a step of probe tokens
  attending to the compressed cache;
- vkv: `memory.plan`'s target pass and virtual-token optimisation, after am's fit of its verbatim share.

Widths that depend on the data (how many entries each head keeps under a head-wise budget) are taken at their bound:
a head at `head_cap` of the span for am's normal equations, the mean budget elsewhere (said where it is used).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rich.table import Table

from vkv.compress.budget import DEFAULT_RATIO, entries_at
from vkv.compress.compaction import GRAM_ELEMENTS
from vkv.compress.compaction import SCORE_ELEMENTS as FIT_SCORE_ELEMENTS
from vkv.compress.config import DEFAULT_VERBATIM_SHARE
from vkv.compress.head_hybrid import HeadSplit
from vkv.compress.reconstruction import DEFAULT_CHUNK
from vkv.compress.reconstruction import SCORE_ELEMENTS as READ_OUT_SCORE_ELEMENTS
from vkv.compress.reference_queries import REFERENCE_CAP
from vkv.errors import VkvError
from vkv.io import write_json_atomic
from vkv.lm.capture import LOGIT_ROWS
from vkv.lm.ragged_attention import SCORE_ELEMENTS as RAGGED_SCORE_ELEMENTS
from vkv.lm.spec import prefill_bytes, spec_from_config
from vkv.methods.kvopt import KVOPT_QUERIES
from vkv.tools.memory import (
    GIB,
    PLANNED_METHODS,
    WEIGHT_BYTES,
    PlanConfig,
    Shapes,
    plan,
    plan_inputs,
    saved_elements_per_layer,
    weight_bytes,
)

METHODS = PLANNED_METHODS
REQUEST_TOKENS = 32  # a read-out chunk's request ("Repeat the previous context exactly." and the quoted tokens)
AM_HEAD_CAP = 0.75  # am's default head_cap: the widest row its normal equations can be
KVOPT_ADAM_COPIES = 6  # start, parameter, gradient, Adam's two moments, best iterate
KVOPT_DISTILL_TOKENS = 256  # kvopt's default distill_step_tokens: probe tokens per distillation step
F32, F64 = 4, 8


@dataclass
class MethodPlan:
    """One method's planned peak: the weights and the window's KV cache, plus its largest stage; bytes throughout."""

    method: str
    model: str
    quant: str
    device: str
    window: int
    ratio: float
    chunk: int
    weights: int
    window_kv: int
    stages: list[tuple[str, int, str]]  # (stage, bytes on the device beyond weights and window KV, what)
    host: list[tuple[str, int, str]] = field(default_factory=list)  # what the method keeps on the host meanwhile
    capacity: int | None = None

    @property
    def working(self) -> int:
        return max(size for _, size, _ in self.stages)

    @property
    def peak_stage(self) -> str:
        return max(self.stages, key=lambda s: s[1])[0]

    @property
    def total(self) -> int:
        return self.weights + self.window_kv + self.working

    @property
    def host_total(self) -> int:
        return sum(size for _, size, _ in self.host)

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else self.total <= self.capacity

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "model": self.model,
            "quant": self.quant,
            "device": self.device,
            "window": self.window,
            "ratio": self.ratio,
            "chunk": self.chunk,
            "weights": self.weights,
            "window_kv": self.window_kv,
            "working": self.working,
            "peak_stage": self.peak_stage,
            "total": self.total,
            "host": self.host_total,
            "fits": self.fits,
            "capacity": self.capacity,
            "stages": {name: size for name, size, _ in self.stages},
            "host_items": {name: size for name, size, _ in self.host},
            "planned": True,  # arithmetic from the config, not a measurement
        }


@dataclass(frozen=True)
class _Sizes:
    """The quantities every stage's arithmetic reads."""

    s: Shapes
    config: object
    window: int
    span: int
    chunk: int  # tokens fed per read-out chunk, its request included
    fed: int  # tokens the whole read-out feeds: the span and every chunk's request
    itemsize: int  # the model's activations and cache
    budget: int  # entries per KV head at the ratio

    @property
    def kv_per_token(self) -> int:
        return self.s.layers * 2 * self.s.kv_heads * self.s.head_dim * self.itemsize

    def span_kv_f32(self) -> int:
        """The span's keys and values stacked in float32 (`SpanWork.span_kv`), on the device."""
        return 2 * self.s.layers * self.s.kv_heads * self.span * self.s.head_dim * F32

    def queries(self, cap: int) -> int:
        """Reference queries per KV head: every query head of at most cap // group read-out tokens."""
        group = self.s.heads // self.s.kv_heads
        return group * min(self.span, max(1, cap // group))


def _sizes(config, window: int, span: int, ratio: float, chunk: int, itemsize: int) -> _Sizes:
    piece = min(chunk, span)
    fed = span + math.ceil(span / piece) * REQUEST_TOKENS
    budget = entries_at(span, ratio)
    return _Sizes(Shapes.from_config(config), config, window, span, piece + REQUEST_TOKENS, fed, itemsize, budget)


def prefill_stage(z: _Sizes) -> tuple[str, int, str]:
    spec = spec_from_config(z.config)
    rows = min(z.span + 1, LOGIT_ROWS)
    size = prefill_bytes(spec, z.s.intermediate, z.window, rows, z.itemsize, z.itemsize) - z.window * z.kv_per_token
    return "prefill", size, f"one layer's MLP over {z.window} tokens, {rows} rows of logits for surprisal"


def read_out_stage(z: _Sizes, beside: int = 0, what: str = "") -> tuple[str, int, str]:
    """The reconstruction pass's largest moment, with `beside` bytes the method already holds on the device."""
    s, f = z.s, z.chunk
    width = z.window + f  # the context, the span and the chunk fed on it
    cache = width * z.kv_per_token
    attention = min(s.heads * f * width, RAGGED_SCORE_ELEMENTS) * 3 * F32  # a block of rows' scores, cat, softmax
    mlp = 3 * f * s.intermediate * z.itemsize
    logits = f * s.vocab * (z.itemsize + F32)
    score_rows = min(f, max(1, READ_OUT_SCORE_ELEMENTS // (s.heads * width)))
    scoring = s.heads * width * s.head_dim * F32 + 2 * s.heads * score_rows * width * F32 + s.heads * z.span * F32
    size = beside + cache + max(attention, mlp, logits, scoring)
    return (
        "read-out",
        size,
        f"{what}a copy of the {z.window}-token cache plus chunks of {f} fed tokens: the largest of their attention "
        f"scores ({attention / GIB:.2f} GiB), logits ({logits / GIB:.2f}), MLP ({mlp / GIB:.2f}), scoring "
        f"({scoring / GIB:.2f})",
    )


def _fit_bytes(rows: int, queries: int, width: int) -> int:
    """One `compact_rows` group of `rows` rows keeping `width` entries each, over `queries` queries: the
    statistics and the fit's score blocks (the scores and the design, float32) within FIT_SCORE_ELEMENTS, and normal
    equations within GRAM_ELEMENTS or one row's own (accumulated in place in float32, then the solver's float64 copy
    and its float64 factor)."""
    block = min(rows * queries * width, FIT_SCORE_ELEMENTS)
    gram = max(min(rows * width * width, GRAM_ELEMENTS), width * width)
    return 2 * block * F32 + gram * (F32 + 2 * F64)


def am_stages(z: _Sizes, budget: int, cap: int = REFERENCE_CAP) -> list[tuple[str, int, str]]:
    s = z.s
    m = z.queries(cap)
    span_kv = z.span_kv_f32()
    queries = s.layers * s.kv_heads * m * s.head_dim * F32
    stats_block = min(s.kv_heads * m * z.span, FIT_SCORE_ELEMENTS) * F32
    kept_stats = 2 * s.layers * s.kv_heads * m * F32 + 2 * s.layers * s.kv_heads * z.span * F32
    statistics = span_kv + queries + stats_block + kept_stats
    f = z.chunk
    hidden = z.fed * s.hidden * z.itemsize
    projections = z.fed * (s.heads + 2 * s.kv_heads) * s.head_dim * z.itemsize + 2 * z.fed * s.head_dim * F32
    context = z.window - z.span + budget  # what the read-out attends to at a compacted layer
    layer_run = max(s.heads * f * (context + f) * 3 * F32, 3 * f * s.intermediate * z.itemsize)
    widest = min(z.span, max(budget, math.floor(AM_HEAD_CAP * z.span)))
    layer_queries = 2 * s.kv_heads * m * s.head_dim * F32  # the layer's queries and what they read from the span
    fit = layer_queries + _fit_bytes(s.kv_heads, m, widest)
    on_policy = span_kv + queries + hidden + projections + (z.window - z.span) * z.kv_per_token + max(layer_run, fit)
    return [
        read_out_stage(z, span_kv, "the span's K/V in float32, "),
        (
            "reference queries",
            span_kv + 2 * queries,
            f"{m} float32 queries per KV head, every layer's, stacked from per-layer tensors",
        ),
        ("statistics", statistics, "a layer's score block, every query's maximum and mass kept"),
        (
            "on-policy fit",
            on_policy,
            f"{z.fed} read-out tokens' hidden states and one layer's projections; a layer's fit with a head "
            f"of up to {widest} entries (head_cap {AM_HEAD_CAP:g} of the span): float32 normal equations, float64 factors",
        ),
    ]


def kvopt_stages(z: _Sizes, quant: str) -> list[tuple[str, int, str]]:
    s = z.s
    m = z.queries(KVOPT_QUERIES)
    t = z.budget  # mean entries per head; a head-wise budget pads every row to the widest
    rows = s.layers * s.kv_heads
    span_kv = z.span_kv_f32()
    queries = rows * m * s.head_dim * F32
    targets = rows * m * (s.head_dim + 1) * F32  # each query's read-out and log-normaliser
    prepare = span_kv + 2 * queries + targets + s.kv_heads * (m + 2 * z.span) * s.head_dim * F32
    prepare += _fit_bytes(s.kv_heads, m, t)
    params = KVOPT_ADAM_COPIES * rows * t * (2 * s.head_dim + 1) * F32
    adam = span_kv + queries + targets + params + 4 * s.kv_heads * m * t * F32  # one layer's graph at a time
    n = KVOPT_DISTILL_TOKENS
    width = z.window - z.span + t + n
    saved = saved_elements_per_layer(s, n, width, quant)
    activations = s.layers * (
        saved["attention_weights"] * F32 + sum(v for k, v in saved.items() if k != "attention_weights") * z.itemsize
    )
    compressed = rows * t * (2 * s.head_dim + 1) * F32 * 4  # entries, gradient, Adam's moments
    logits = 2 * n * s.vocab * (z.itemsize + F32 + F32)  # teacher's and student's log-probabilities
    distill = compressed + activations + logits + z.window * z.kv_per_token  # the teacher's full-context cache
    return [
        read_out_stage(z, span_kv, "the span's K/V in float32, "),
        ("fit start", prepare, f"{m} queries per KV head, a layer's statistics and am's fit of {t} entries per head"),
        ("Adam", adam, f"{t} free entries per head × {KVOPT_ADAM_COPIES} copies, one layer's loss graph"),
        ("distillation", distill, f"forward and backward of {n} probe tokens over the compressed cache"),
    ]


def vkv_stages(z: _Sizes, config, quant: str, device: str, ratio: float) -> list[tuple[str, int, str]]:
    verbatim = HeadSplit.of(z.budget, DEFAULT_VERBATIM_SHARE).verbatim
    am = [(f"am verbatim: {name}", size, how) for name, size, how in am_stages(z, verbatim)]
    p = plan(config, quant=quant, window=z.window, span=z.span, ratio=ratio, device=device)
    return [
        *am,
        ("target pass", p.target_pass, "vkv plan's target pass"),
        (
            "optimisation",
            p.optimisation_working,
            f"vkv plan's optimisation of {p.virtual_tokens} virtual tokens ({p.precision} activations)",
        ),
    ]


def plan_method(
    config,
    method: str,
    quant: str = "8bit",
    window: int = 4096,
    ratio: float = DEFAULT_RATIO,
    device: str = "cuda",
    chunk: int = DEFAULT_CHUNK,
    span: int | None = None,
    capacity_gib: float | None = None,
    name: str = "",
) -> MethodPlan:
    """`method`'s planned memory compressing the last `span` tokens (default: all) of a `window` at `ratio` on
    `device`."""
    if method not in METHODS:
        raise VkvError(f"--method {method}: choose one of {', '.join(METHODS)} or all")
    if quant not in WEIGHT_BYTES:
        raise VkvError(f"--quant {quant}: choose one of {', '.join(WEIGHT_BYTES)}")
    cuda = device.startswith("cuda")
    itemsize = 2 if cuda or quant in ("bf16", "fp16") else 4  # as `memory.plan`: bitsandbytes loads fp16 on CUDA
    span = window if span is None else span
    if not 0 < span <= window:
        raise VkvError(f"--span {span}: need 0 < span ≤ window ({window})")
    z = _sizes(config, window, span, ratio, chunk, itemsize)
    s = z.s
    stages = [prefill_stage(z)]
    if method == "kvzip":
        stages.append(read_out_stage(z))
    elif method == "am":
        stages += am_stages(z, z.budget)
    elif method == "kvopt":
        stages += kvopt_stages(z, quant)
    else:
        stages += vkv_stages(z, config, quant, device, ratio)
    captured = 2 * s.layers * s.kv_heads * z.span * s.head_dim * F32
    read_out = s.layers * s.heads * z.span * s.head_dim * F32  # every method here runs the reconstruction pass
    host = [
        ("captured span V and K", captured, "float32, from the prefill's hooks"),
        ("read-out queries", read_out, f"float32, every layer's, {z.span} tokens"),
    ]
    return MethodPlan(
        method=method,
        model=name or getattr(config, "_name_or_path", "") or s.model_type,
        quant=quant,
        device=device,
        window=window,
        ratio=ratio,
        chunk=z.chunk - REQUEST_TOKENS,
        weights=weight_bytes(s, quant, itemsize),
        window_kv=window * z.kv_per_token,
        stages=stages,
        host=host,
        capacity=None if capacity_gib is None else int(capacity_gib * GIB),
    )


PLANNED_NOTE = (
    "planned from the model config (arithmetic following each method's code), not measured: `vkv bench compress` "
    "measures a method's peak on a device"
)


def method_table(plans: list[MethodPlan]) -> Table:
    """One row per method: weights, KV cache, its largest stage, the total and the verdict; host memory apart."""
    p = plans[0]
    table = Table(
        title=f"planned memory: {p.model} {p.quant} on {p.device}, window {p.window} at ratio {p.ratio:g}",
        caption=PLANNED_NOTE,
    )
    for column in ("method", "weights GiB", "KV cache GiB", "working GiB", "largest stage", "total GiB"):
        table.add_column(column, justify="left" if column in ("method", "largest stage") else "right")
    table.add_column("fits" if p.capacity is None else f"fits {p.capacity / GIB:g} GiB")
    table.add_column("host GiB", justify="right")
    for q in plans:
        verdict = "" if q.fits is None else ("yes" if q.fits else "NO")
        table.add_row(
            q.method,
            f"{q.weights / GIB:.2f}",
            f"{q.window_kv / GIB:.2f}",
            f"{q.working / GIB:.2f}",
            q.peak_stage,
            f"{q.total / GIB:.2f}",
            verdict,
            f"{q.host_total / GIB:.2f}",
        )
    return table


def stage_table(p: MethodPlan) -> Table:
    """Every stage of one method, beyond the weights and the window's KV cache, and what the host holds."""
    table = Table(title=f"{p.method}: each stage on top of weights and KV cache")
    table.add_column("stage")
    table.add_column("GiB", justify="right")
    table.add_column("from")
    for name, size, how in p.stages:
        table.add_row(name, f"{size / GIB:.2f}", how)
    for name, size, how in p.host:
        table.add_row(f"host: {name}", f"{size / GIB:.2f}", how)
    return table


def run_method_plans(config: PlanConfig) -> int:
    """`vkv plan --method`: each method's planned peak at `config.window` (the whole window compressed); 1 when
    any does not fit `config.memory` GiB."""
    console, model_config = plan_inputs(config)
    methods = METHODS if config.method == "all" else (config.method,)
    plans = [
        plan_method(
            model_config,
            method,
            quant=config.quant,
            window=config.window,
            ratio=config.ratio,
            device=config.device,
            chunk=config.chunk,
            span=config.span,
            capacity_gib=config.memory,
            name=config.model,
        )
        for method in methods
    ]
    console.print(method_table(plans))
    if len(plans) == 1:
        console.print(stage_table(plans[0]))
    if config.json:
        write_json_atomic(config.json, {"planned": PLANNED_NOTE, "methods": [p.to_dict() for p in plans]})
        console.print(f"wrote {config.json}")
    return 0 if all(p.fits for p in plans) else 1
