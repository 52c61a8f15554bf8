"""Memory budget of one compression, computed from a model config: will it fit on this device?

Two phases share the weights. The target pass runs the frozen model once over the window (no gradients):
its KV cache, one layer's transient activations, the span's logits for surprisal, and the captured span
V/K. The optimisation runs k virtual tokens through the layers the loss needs, keeping for backward what
vkv's direct forward saves (counted tensor by tensor in `saved_elements_per_layer`, checked against
measurement on the test model), next to the window's KV cache and the optimiser state. The peak is the
weights plus the larger phase.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from transformers import AutoConfig

from vkv.compress.budget import DEFAULT_RATIO, entries_at
from vkv.compress.precision import cpu_has_amx
from vkv.compress.reconstruction import chunk_setting
from vkv.errors import VkvError
from vkv.io import write_json_atomic
from vkv.lm.capture import LOGIT_ROWS
from vkv.lm.load import DEFAULT_MODEL, resolve_model_path
from vkv.lm.shapes import SHAPES
from vkv.lm.spec import prefill_bytes, spec_from_config
from vkv.settings import check_ranges, setting

GIB = 2**30

# The shipped shapes by the hub id of their model, so `vkv plan` needs neither the hub nor the weights.
PRESETS = {shape.hub_id: shape for shape in SHAPES.values() if shape.hub_id}
# The methods `vkv plan --method` plans (tools/method_memory.py), each from what its code allocates.
PLANNED_METHODS = ("kvzip", "am", "kvopt", "vkv")
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "8bit": 1.0, "4bit": 0.5}


@dataclass(frozen=True)
class Shapes:
    """What the budget depends on, read from a transformers config."""

    model_type: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: bool

    @classmethod
    def from_config(cls, config) -> Shapes:
        heads = config.num_attention_heads
        return cls(
            model_type=config.model_type,
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            vocab=config.vocab_size,
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
            qk_norm=config.model_type == "qwen3",
        )


def load_config(model: str):
    """A transformers config for a preset name, a vkv alias, a directory, or a cached hub id (never downloads)."""
    if model in PRESETS:
        return PRESETS[model].config()
    path, local = resolve_model_path(model)
    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except OSError as exc:
        known = ", ".join(PRESETS)
        raise VkvError(f"no config for '{model}' on this machine (presets: {known}; or pass a directory)") from exc


@dataclass
class MemoryPlan:
    model: str
    quant: str
    device: str
    window: int  # tokens of context the compression sees: prefix + span
    span: int
    ratio: float
    virtual_tokens: int
    attention_width: int  # keys each virtual token attends to: prefix + virtual tokens
    batch: int
    precision: str  # of the optimisation's activations
    weights: int  # bytes, like every field below
    window_kv: int
    target_pass: int  # transient, while computing targets
    activations: int  # kept for backward during one optimisation step
    step_transient: int  # largest temporaries of one step beyond what is kept
    optimiser_state: int
    capacity: int | None = None

    @property
    def target_phase(self) -> int:
        return self.weights + self.window_kv + self.target_pass

    @property
    def optimisation_phase(self) -> int:
        return self.weights + self.window_kv + self.activations + self.step_transient + self.optimiser_state

    @property
    def optimisation_working(self) -> int:
        """What an optimisation run adds on top of the loaded model and the cached window."""
        return self.activations + self.step_transient + self.optimiser_state

    @property
    def peak(self) -> int:
        return max(self.target_phase, self.optimisation_phase)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            target_phase=self.target_phase,
            optimisation_phase=self.optimisation_phase,
            peak=self.peak,
            fits=None if self.capacity is None else self.peak <= self.capacity,
        )
        return d

    def rows(self) -> list[tuple[str, int, str]]:
        s = self
        return [
            (
                "weights",
                s.weights,
                f"{s.quant}: int8/nf4 linear layers, embeddings and norms unquantised"
                if s.quant in ("8bit", "4bit")
                else f"{s.quant} parameters",
            ),
            ("window KV cache", s.window_kv, f"{s.window} tokens × layers × K and V"),
            (
                "target pass (transient)",
                s.target_pass,
                f"one layer's activations over {s.window} tokens, "
                f"{min(s.span + 1, LOGIT_ROWS)} rows of logits for surprisal, captured V/K of {s.span} tokens",
            ),
            (
                "activations kept for backward",
                s.activations,
                f"{s.batch} × {s.virtual_tokens} virtual tokens, attention over {s.attention_width} keys",
            ),
            (
                "step transient",
                s.step_transient,
                "attention-weight gradients of one layer"
                + (", one dequantised weight" if s.quant in ("8bit", "4bit") else "")
                + (", bf16 copies of the linear weights" if s.precision == "bf16" and s.quant == "fp32" else ""),
            ),
            ("optimiser state", s.optimiser_state, "fp32 embeddings, step copy, gradient, Adam m and v, best copy"),
            (
                "peak: weights + KV + the larger phase",
                s.peak,
                "target pass" if s.target_phase >= s.optimisation_phase else "optimisation",
            ),
        ]


def weight_bytes(shapes: Shapes, quant: str, unquantised_bytes: int) -> int:
    """Parameters as loaded: linear layers at the quantisation; embeddings, LM head and norms in the
    unquantised dtype (bitsandbytes keeps them so; int8 adds a per-row fp32 scale)."""
    s = shapes
    q_out, kv_out = s.heads * s.head_dim, s.kv_heads * s.head_dim
    linear_shapes = [
        (s.hidden, q_out),
        (s.hidden, kv_out),
        (s.hidden, kv_out),
        (q_out, s.hidden),
        (s.hidden, s.intermediate),
        (s.hidden, s.intermediate),
        (s.intermediate, s.hidden),
    ]
    linear = sum(i * o for i, o in linear_shapes) * s.layers
    rows = sum(o for _, o in linear_shapes) * s.layers
    other = s.vocab * s.hidden * (1 if s.tied_embeddings else 2)
    other += s.layers * (
        2 * s.hidden + (q_out + 2 * kv_out if s.qkv_bias else 0) + (2 * s.head_dim if s.qk_norm else 0)
    )
    other += s.hidden  # final norm
    if quant == "8bit":
        linear_total = linear * 1 + rows * 4
    elif quant == "4bit":
        linear_total = linear * 0.5 + linear / 64 * 4  # nf4 with one fp32 absmax per 64-value block
    else:
        linear_total = linear * WEIGHT_BYTES[quant]
    return int(linear_total + other * unquantised_bytes)


def saved_elements_per_layer(shapes: Shapes, n: int, width: int, quant: str) -> dict[str, int]:
    """Elements autograd keeps per decoder layer in vkv's direct forward (frozen weights: only what input
    gradients need), for n tokens attending to `width` keys. int8 layers also keep each linear's input."""
    s = shapes
    d, q_out, kv_out = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    counts = {
        "residual": 2 * n * d,  # the two RMSNorm inputs
        "projections": 2 * n * q_out + 2 * n * kv_out,  # scaled queries, attention output; keys, values
        "attention_weights": s.heads * n * width,  # exp(scores - shift), prefix and new keys
        "mlp": 3 * n * s.intermediate,  # gate, its SiLU, up
    }
    if quant in ("8bit", "4bit"):
        counts["int8_inputs"] = 2 * n * d + n * q_out + n * s.intermediate
    return counts


def plan(
    config,
    quant: str = "8bit",
    window: int = 4096,
    ratio: float = DEFAULT_RATIO,
    span: int | None = None,
    device: str = "cuda",
    batch: int = 1,
    capacity_gib: float | None = None,
    name: str = "",
    precision: str = "auto",
) -> MemoryPlan:
    """The memory budget of compressing `span` tokens (default: the whole window) at `ratio`, with the
    window's KV cache in memory, on `device`. `precision` of the optimisation's activations as in
    `OptimConfig` (auto: bf16 on CUDA, and on a CPU with AMX for unquantised weights; else fp32)."""
    if quant not in WEIGHT_BYTES:
        raise VkvError(f"unknown quantisation '{quant}'; choose one of {', '.join(WEIGHT_BYTES)}")
    span = window if span is None else span
    if not 0 < span <= window or ratio < 1:
        raise VkvError(f"need 0 < span ≤ window and ratio ≥ 1, got span={span}, window={window}, ratio={ratio}")
    s = Shapes.from_config(config)
    cuda = device.startswith("cuda")
    unquantised = 2 if cuda or quant in ("bf16", "fp16") else 4  # bitsandbytes on CUDA loads fp16 around int8
    if precision == "auto":
        precision = "bf16" if cuda or (quant in ("fp32", "bf16", "fp16") and cpu_has_amx()) else "fp32"
    activation = 2 if precision == "bf16" else 4
    n = entries_at(span, ratio)
    width = window - span + n

    kv_per_token = s.layers * 2 * s.kv_heads * s.head_dim * unquantised
    target_pass = (
        prefill_bytes(
            spec_from_config(config), s.intermediate, window, min(span + 1, LOGIT_ROWS), unquantised, activation
        )
        - window * kv_per_token  # counted as window_kv
        + 2 * s.layers * s.kv_heads * span * s.head_dim * 4  # captured V and pre-RoPE K, fp32
    )
    per_layer = saved_elements_per_layer(s, n, width, quant)
    residual_bytes = 4  # the residual stream and norms stay fp32 (fp16 embeddings + bf16 outputs promote)
    layer_bytes = (
        per_layer["residual"] * residual_bytes
        + per_layer["attention_weights"] * 4
        + sum(v for k, v in per_layer.items() if k not in ("residual", "attention_weights")) * activation
    )
    last_layer = n * s.hidden * residual_bytes  # the deepest needed layer: its norm input, then V (and K)
    loss_inputs = 2 * s.layers * n * s.kv_heads * s.head_dim * 4  # stacked V (and K) in fp32
    activations = batch * ((s.layers - 1) * layer_bytes + last_layer + loss_inputs)
    step_transient = batch * 2 * s.heads * n * width * 4  # gradient of one layer's attention weights, twice
    if quant in ("8bit", "4bit"):
        step_transient += s.hidden * s.intermediate * unquantised  # bitsandbytes dequantises for backward
    optimiser = batch * 6 * n * s.hidden * 4
    if precision == "bf16" and quant == "fp32":  # bf16 copies of the fp32 linear weights, made once per run
        step_transient += weight_bytes(s, "bf16", 0)
    return MemoryPlan(
        model=name or getattr(config, "_name_or_path", "") or s.model_type,
        quant=quant,
        device=device,
        window=window,
        span=span,
        ratio=ratio,
        virtual_tokens=n,
        attention_width=width,
        batch=batch,
        precision=precision,
        weights=weight_bytes(s, quant, unquantised),
        window_kv=window * kv_per_token,
        target_pass=int(target_pass),
        activations=int(activations),
        step_transient=int(step_transient),
        optimiser_state=int(optimiser),
        capacity=None if capacity_gib is None else int(capacity_gib * GIB),
    )


def plan_table(p: MemoryPlan):
    title = (
        f"memory plan: {p.model} {p.quant} on {p.device} ({p.precision} activations), window {p.window}, "
        f"span {p.span} at ratio {p.ratio:g} → {p.virtual_tokens} virtual tokens"
    )
    table = Table(title=title)
    table.add_column("item")
    table.add_column("GiB", justify="right")
    table.add_column("from")
    for item, size, how in p.rows():
        table.add_row(item, f"{size / GIB:.2f}", how)
    if p.capacity is not None:
        verdict = "fits" if p.peak <= p.capacity else "does NOT fit"
        table.add_row(
            f"capacity: {verdict}", f"{p.capacity / GIB:.2f}", f"headroom {(p.capacity - p.peak) / GIB:+.2f} GiB"
        )
    return table


MAX_CANDIDATES = 4096  # spans `worst_span` compares; a 4096-token window in steps of 64 needs 64


def worst_span(config, window: int = 4096, step: int = 64, **kwargs) -> MemoryPlan:
    """The plan of the span (a multiple of `step` tokens, or the whole window) with the highest peak: a
    short span leaves a long prefix to attend to, a long one many virtual tokens. At most MAX_CANDIDATES spans are
    tried: a window of 10¹² tokens is searched in coarser steps (still multiples of `step`), not over 10¹⁰ plans."""
    step = max(step, -(-window // (MAX_CANDIDATES * step)) * step)
    spans = sorted(set(range(step, window, step)) | {window})
    return max((plan(config, window=window, span=span, **kwargs) for span in spans), key=lambda p: p.peak)


# ---- the command ---------------------------------------------------------------------------------------


@dataclass
class PlanConfig:
    """`vkv plan`'s settings: the compression to budget and the device's memory."""

    model: str = setting(DEFAULT_MODEL, f"preset ({', '.join(PRESETS)}), alias or directory")
    quant: str = setting("8bit", "quantisation of the weights", choices=tuple(WEIGHT_BYTES))
    device: str = setting("cuda", "cuda (bf16 activations) or cpu (fp32)")
    window: int = setting(4096, "context tokens the compression sees", minimum=1)
    span: int | None = setting(None, "tokens compressed (default: the whole window)", minimum=1)
    ratio: float = setting(DEFAULT_RATIO, "span tokens per virtual token", minimum=1)
    precision: str = setting(
        "auto",
        "activations during optimisation (auto: bf16 on CUDA and AMX CPUs, else fp32)",
        choices=("auto", "fp32", "bf16"),
    )
    batch: int = setting(1, "spans optimised together", minimum=1)
    memory: float = setting(32.0, "device memory in GiB", minimum=0, above=True)
    method: str | None = setting(
        None,
        "plan each method's peak, stage by stage: kvzip, am, kvopt, vkv or all (default: vkv's virtual-token "
        "optimisation in detail)",
        choices=(*PLANNED_METHODS, "all"),
    )
    chunk: int = chunk_setting()
    json: str | None = setting(None, "also write the plan here")


def plan_inputs(config: PlanConfig) -> tuple[Console, Any]:
    """The console a plan prints on and the model's config, `config` checked: refused for a window beyond the model's
    positions (a plan for a window the model cannot attend over answers nothing)."""
    check_ranges(config)
    model_config = load_config(config.model)
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions and config.window > positions:
        raise VkvError(
            f"--window {config.window}: beyond the {positions} positions of {config.model}; plan a window of at most "
            f"{positions} tokens"
        )
    return Console(width=None if sys.stdout.isatty() else 120), model_config


def run_plan(config: PlanConfig) -> int:
    """Print the plan of `config` (virtual tokens) and of the worst span in its window; 1 when the plan does not fit
    (`vkv plan --method` is vkv.tools.method_memory's)."""
    console, model_config = plan_inputs(config)
    common = dict(
        quant=config.quant,
        ratio=config.ratio,
        device=config.device,
        batch=config.batch,
        capacity_gib=config.memory,
        name=config.model,
        precision=config.precision,
    )
    p = plan(model_config, window=config.window, span=config.span, **common)
    console.print(plan_table(p))
    worst = worst_span(model_config, window=config.window, **common)
    verdict = "fits" if worst.peak <= worst.capacity else "does NOT fit"
    console.print(
        f"worst span in a {config.window}-token window: {worst.span} tokens ({worst.virtual_tokens} virtual "
        f"tokens attending to {worst.attention_width} keys) → peak {worst.peak / GIB:.2f} GiB, {verdict} "
        f"in {config.memory:g} GiB"
    )
    if config.json:
        write_json_atomic(config.json, {**p.to_dict(), "worst_span": worst.to_dict()})
        console.print(f"wrote {config.json}")
    return 0 if p.peak <= p.capacity else 1
