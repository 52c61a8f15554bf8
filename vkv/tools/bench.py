"""`vkv bench optimizer`: vkv's optimiser against a straightforward loop on the same span, in one run.

The reference loop is what one writes first: every step clones the prefix cache, runs the whole model with
its LM head, reads the new tokens' V back from the cache, and steps torch's Adam with the same loss, learning
rate, clipping and pooled initialisation. vkv runs twice: with exactly those settings (the same trajectory,
so the difference is the cost of a step) and with its defaults (also fewer steps), stopping once it reaches
the reference's final loss. Because a shared machine's load drifts over minutes, one step of each (and
the floor's matmuls) are also timed in alternation, round robin; those ratios are the robust ones. Next to
them: the compute floor (the matmul FLOPs one step needs divided by the throughput measured on this machine
at the step's shapes), peak working memory, the memory plan's estimate, and a profile of each step.
"""

from __future__ import annotations

import ctypes
import gc
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from torch.profiler import ProfilerActivity, profile

from vkv.compress.budget import DEFAULT_RATIO, span_budget
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import (
    Batch,
    OptimConfig,
    OptimResult,
    activation_dtype,
    autocast,
    layer_losses,
    optimise,
    uses_bf16,
)
from vkv.compress.problem import SpanProblem
from vkv.compress.targets import Targets
from vkv.io import write_json_atomic
from vkv.kv.prefix import KVPrefix
from vkv.lm.capture import capture_span
from vkv.lm.frozen import FrozenLM
from vkv.lm.load import load_model
from vkv.progress import counted
from vkv.settings import check_ranges, setting
from vkv.text.transcript import load_transcript, parse_turn_span, render
from vkv.tools.memory import plan

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SPANS = [  # a span of a few hundred tokens after a long prefix; the fixture when the transcripts are absent
    (ROOT / "transcripts" / "dev" / "taskapi-express-sqlite.json", "turns:8-9"),
    (ROOT / "tests" / "fixtures" / "mini-agent.json", "turns:3-7"),
]


# ---- the span ---------------------------------------------------------------------------------------


@dataclass
class Span:
    transcript: str
    start: int
    end: int
    prefix: KVPrefix  # views into the capture pass's cache, never modified
    targets: Targets
    positions: torch.Tensor

    @property
    def problem(self) -> tuple[KVPrefix, Targets, torch.Tensor]:
        return self.prefix, self.targets, self.positions


def prepare_span(lm: FrozenLM, transcript_path: str | Path, span: str, ratio: float) -> Span:
    """Render, capture the span, build its problem with the default recipe: what `vkv compress` optimises."""
    transcript = load_transcript(transcript_path)
    rendered = render(transcript, lm.tokenizer)
    start, end = rendered.token_span(*parse_turn_span(span, transcript))
    acts, cache = capture_span(lm, rendered.ids, start, end, keep_cache=True)
    # the optimiser's problem: the default recipe's targets and positions for `budget` virtual tokens; how each head
    # spends its share (and which entries stay verbatim) is not part of it
    config = replace(CompressConfig().validate(), head_budget="shared")
    message_starts = [s.start for s in rendered.spans]
    problem = SpanProblem.build(lm, rendered.ids, acts, span_budget(end - start, ratio), config, message_starts)
    prefix = KVPrefix.from_cache(cache, start)
    return Span(str(transcript_path), start, end, prefix, problem.targets, problem.positions)


# ---- the reference loop -------------------------------------------------------------------------------


def reference_losses(
    lm: FrozenLM,
    prefix: KVPrefix,
    targets: Targets,
    positions: torch.Tensor,
    embeddings: torch.Tensor,
    loss: str = "mse",
) -> torch.Tensor:
    """Per-layer losses `[layers]` computed the straightforward way: a clone of the prefix in a fresh cache,
    the whole model with its LM head, the new tokens' K/V read back from the cache."""
    cache = lm.new_cache()
    for layer, (k, v) in enumerate(zip(prefix.keys, prefix.values)):
        cache.update(k.clone(), v.clone(), layer)
    length, n = prefix.length, embeddings.shape[0]
    lm.model(
        inputs_embeds=embeddings[None].to(lm.device, lm.dtype),
        **lm.with_cache(cache),
        position_ids=positions.to(lm.device).float()[None],
        attention_mask=lm.causal_mask(length, n),
        use_cache=True,
    )
    new = KVPrefix.from_cache(cache).slice(length)
    keys, values = new.keys, new.values
    if not targets.spec.rope_keys:
        keys = [lm.rotate(k, positions, inverse=True) for k in keys]
    return layer_losses(keys, values, targets, loss)


def reference_optimise(
    lm: FrozenLM,
    prefix: KVPrefix,
    targets: Targets,
    positions: torch.Tensor,
    steps: int,
    lr: float,
    clip: float = 1.0,
    on_step: Callable[[int, float], None] | None = None,
) -> torch.Tensor:
    """The straightforward loop: torch's Adam from the pooled embeddings; returns the final embeddings."""
    embeddings = targets.pooled_embeddings.clone().to(lm.device).requires_grad_(True)
    optimiser = torch.optim.Adam([embeddings], lr=lr)
    for step in range(steps + 1):
        loss = reference_losses(lm, prefix, targets, positions, embeddings).mean()
        if on_step:
            on_step(step, loss.item())
        if step == steps:
            break
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([embeddings], clip)
        optimiser.step()
    return embeddings.detach()


def vkv_loss_and_grad(
    lm: FrozenLM,
    prefix: KVPrefix,
    targets: Targets,
    positions: torch.Tensor,
    embeddings: torch.Tensor,
    config: OptimConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss vkv's optimiser minimises (mean over layers) and its gradient, through vkv's own forward."""
    config = config or OptimConfig()
    batch = Batch.build(lm, [(prefix, targets, positions)], activation_dtype(lm, config.precision))
    leaf = embeddings[None].to(lm.device).float().requires_grad_(True)
    with lm.compute_weights(torch.bfloat16 if uses_bf16(lm, config.precision) else None):
        with autocast(lm, config.precision):
            loss = batch.per_layer_losses(lm, leaf, config.loss, lm.spec.num_layers - 1).float().mean()
        loss.backward()
    return loss.detach(), leaf.grad[0]


def vkv_step(lm: FrozenLM, span: Span, embeddings: torch.Tensor, config: OptimConfig) -> Callable[[], None]:
    """One optimiser step's forward and backward, as `optimise` runs it (batch built and, in bf16, weights
    copied once, outside the step)."""
    batch = Batch.build(lm, [span.problem], activation_dtype(lm, config.precision))

    def step():
        leaf = embeddings[None].to(lm.device).float().requires_grad_(True)
        with autocast(lm, config.precision):
            loss = batch.per_layer_losses(lm, leaf, config.loss, lm.spec.num_layers - 1).float().mean()
        loss.backward()

    return step


# ---- measuring ----------------------------------------------------------------------------------------


class StepClock:
    """on_step callback recording when each step's loss was known."""

    def __init__(self):
        self.start = time.perf_counter()
        self.times: list[float] = []
        self.losses: list[float] = []

    def __call__(self, step: int, loss: float) -> None:
        self.times.append(time.perf_counter() - self.start)
        self.losses.append(loss)

    @property
    def seconds_per_step(self) -> float:
        gaps = [b - a for a, b in zip(self.times, self.times[1:])]
        return statistics.median(gaps) if gaps else float("nan")

    def reached(self, target: float, rel_tol: float = 1e-4) -> tuple[int, float] | None:
        """(step, seconds since start) of the first loss ≤ target (within float rounding of it)."""
        for step, (t, loss) in enumerate(zip(self.times, self.losses)):
            if loss <= target * (1 + rel_tol):
                return step, t
        return None


def _rss_mb() -> tuple[float, float]:
    status = Path("/proc/self/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    peak = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    return rss, peak


@contextmanager
def working_memory(device: torch.device) -> Iterator[dict]:
    """Peak memory the block adds on top of what was allocated before it, in MiB. CUDA: torch's allocator
    peak. CPU (Linux): peak resident set size, reset before the block (freed heap returned to the OS first)."""
    found: dict = {"mb": None}
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        yield found
        torch.cuda.synchronize(device)
        found["mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        base, _ = _rss_mb()
    except OSError:
        base = None
    yield found
    if base is not None:
        found["mb"] = _rss_mb()[1] - base


def saved_activation_mb(lm: FrozenLM, run: Callable[[], torch.Tensor], exclude: list[torch.Tensor]) -> float:
    """MiB of distinct tensors autograd keeps for backward while `run()` builds its graph (weights, buffers
    and `exclude`d tensors such as the stored prefix do not count: they exist anyway)."""
    skip = {t.untyped_storage().data_ptr() for t in [*lm.model.parameters(), *lm.model.buffers(), *exclude]}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    del out
    return sum(kept.values()) / 2**20


def interleaved_step_seconds(steps: dict[str, Callable[[], object]], rounds: int = 5) -> dict[str, float]:
    """Median seconds of each step function, timed in alternation (round robin, after one warm-up each) so
    that a machine whose load drifts slows every contender alike."""
    for fn in steps.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


# ---- the compute floor ------------------------------------------------------------------------------


def step_flops(lm: FrozenLM, n: int, width: int, last_layer: int | None = None) -> dict[str, int]:
    """Matmul FLOPs of one optimisation step for n virtual tokens attending to `width` keys (prefix + n).

    Forward: every layer before the deepest needed one in full, that one only to its V projection. Backward
    with frozen weights needs input gradients only: one matmul per linear layer, and for attention the
    queries' and the attention weights' gradients (plus the new keys' and values', n wide)."""
    s = lm.spec
    config = lm.model.config
    last = s.num_layers - 1 if last_layer is None else last_layer
    q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    linear = s.hidden_size * (2 * q_out + 2 * kv_out) + 3 * s.hidden_size * config.intermediate_size
    attention = 4 * s.num_heads * s.head_dim * width  # QKᵀ and PV, per token
    forward = last * 2 * n * linear + last * n * attention + 2 * n * s.hidden_size * kv_out
    backward = last * 2 * n * linear + last * n * (attention + 4 * s.num_heads * s.head_dim * n)
    backward += 2 * n * s.hidden_size * kv_out
    return {"forward": forward, "backward": backward, "total": forward + backward}


def layer_matmuls(lm: FrozenLM, n: int, width: int, dtype: torch.dtype = torch.float32):
    """(a function running every layer's forward matmuls of a step at their shapes — the linear layers with
    n rows, the attention products over `width` keys — and their FLOPs)."""
    s, dev = lm.spec, lm.device
    intermediate = lm.model.config.intermediate_size
    q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    groups = s.num_heads // s.num_kv_heads

    def rand(*shape):
        return torch.randn(*shape, device=dev, dtype=dtype)

    x, up, attention_out = rand(n, s.hidden_size), rand(n, intermediate), rand(n, q_out)
    weights = [rand(o, s.hidden_size) for o in (q_out, kv_out, kv_out, intermediate, intermediate)]
    out_proj, mlp_out = rand(s.hidden_size, q_out), rand(s.hidden_size, intermediate)
    q, keys = rand(s.num_kv_heads, groups * n, s.head_dim), rand(s.num_kv_heads, width, s.head_dim)
    probs = rand(s.num_kv_heads, groups * n, width)
    linear = torch.nn.functional.linear

    def all_layers():  # as long as a forward pass, so that timing it is as noisy as timing a step
        for _ in range(s.num_layers):
            for w in weights:
                linear(x, w)
            linear(attention_out, out_proj)
            linear(up, mlp_out)
            q @ keys.transpose(-1, -2)
            probs @ keys
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    flops = 2 * n * (s.hidden_size * (2 * q_out + 2 * kv_out) + 3 * s.hidden_size * intermediate)
    return all_layers, s.num_layers * (flops + 4 * s.num_heads * s.head_dim * width * n)


def peak_matmul(lm: FrozenLM, dtype: torch.dtype = torch.float32, size: int = 2048, repeats: int = 4):
    """(a function running large square matmuls, their FLOPs): the machine's best case."""
    a = torch.randn(size, size, device=lm.device, dtype=dtype)
    b = torch.randn(size, size, device=lm.device, dtype=dtype)

    def run():
        for _ in range(repeats):
            a @ b

    return run, repeats * 2 * size**3


def profile_step(run: Callable[[], None], rows: int = 14) -> tuple[str, dict[str, float]]:
    """torch.profiler table of `run()` (self time per op) and the share of self time in matmul kernels."""
    run()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    matmul = sum(
        e.self_cpu_time_total
        for e in events
        if e.key in ("aten::mm", "aten::bmm", "aten::addmm", "aten::_int_mm", "aten::baddbmm")
    )
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    shares = {e.key: e.self_cpu_time_total / total for e in top}
    shares["matmul (mm, bmm, addmm)"] = matmul / total
    return events.table(sort_by="self_cpu_time_total", row_limit=rows), shares


# ---- the benchmark --------------------------------------------------------------------------------------


@dataclass
class Run:
    name: str
    clock: StepClock
    final_loss: float  # of the returned embeddings, evaluated in fp32 by vkv's loss
    working_mb: float | None
    saved_mb: float | None = None
    stopped: str = ""
    extra: dict = field(default_factory=dict)

    def row(self, target: float, reference_seconds: float) -> dict:
        reached = self.clock.reached(target)
        return {
            "run": self.name,
            "seconds_per_step": self.clock.seconds_per_step,
            "steps_run": len(self.clock.losses) - 1,
            "steps_to_reference_loss": reached[0] if reached else None,
            "seconds_to_reference_loss": reached[1] if reached else None,
            "time_to_loss_speedup": reference_seconds / reached[1] if reached and reached[1] > 0 else None,
            "final_loss": self.final_loss,
            "working_memory_mb": self.working_mb,
            "saved_for_backward_mb": self.saved_mb,
            "stopped": self.stopped,
            **self.extra,
        }


def _eval_loss(lm: FrozenLM, span: Span, embeddings: torch.Tensor) -> float:
    batch = Batch.build(lm, [span.problem])
    with torch.no_grad():
        return float(
            batch.per_layer_losses(lm, embeddings[None].to(lm.device).float(), "mse", lm.spec.num_layers - 1)
            .float()
            .mean()
        )


def bench_quant(lm: FrozenLM, span: Span, steps: int, lr: float, tuned: OptimConfig, log=print) -> dict:
    """All runs for one loaded model; returns the JSON-ready record."""
    n, width = span.targets.k, span.prefix.length + span.targets.k
    flops = step_flops(lm, n, width)
    same = OptimConfig(
        steps=steps, lr=lr, init="pooled", schedule="constant", patience=steps + 1, betas=(0.9, 0.999), precision="fp32"
    )
    defaults = replace(tuned, steps=max(steps * 2, tuned.steps))
    x = span.targets.pooled_embeddings.detach().to(lm.device)
    log(f"  reference loop: {steps} steps")
    runs = [_reference_run(lm, span, steps, lr, x)]
    target, reference_seconds = runs[0].clock.losses[-1], runs[0].clock.times[-1]
    for name, config in (("vkv, reference settings", same), ("vkv, defaults", replace(defaults, target_loss=target))):
        log(f"  {name}")
        runs.append(_vkv_run(lm, span, name, config, x))
    log("  timing steps and the floor's matmuls in alternation, then profiling one step of each")
    interleaved, profiles, floors = _alternate_and_profile(lm, span, x, same, defaults, flops["total"])
    rows = []
    for run in runs:
        row = run.row(target, reference_seconds)
        row.update(_interleaved_figures(row, interleaved, floors, reference_steps=len(runs[0].clock.losses) - 1))
        rows.append(row)
    return {
        "quant": lm.quant,
        "threads": torch.get_num_threads(),
        "span": {
            "transcript": span.transcript,
            "tokens": [span.start, span.end],
            "prefix": span.prefix.length,
            "virtual_tokens": n,
        },
        "reference_final_loss": target,
        "runs": rows,
        "floor": {"gflop_per_step": flops["total"] / 1e9, **floors},
        "plan": _plan_figures(lm, span),
        "profile": {name: {"table": table, "shares": shares} for name, (table, shares) in profiles.items()},
    }


def _reference_run(lm: FrozenLM, span: Span, steps: int, lr: float, x: torch.Tensor) -> Run:
    """The straightforward loop, its working memory, and what its graph keeps for backward."""
    prefix_tensors = span.prefix.keys + span.prefix.values
    clock = StepClock()
    with working_memory(lm.device) as mem:
        final = reference_optimise(lm, *span.problem, steps=steps, lr=lr, on_step=clock)
    saved = saved_activation_mb(
        lm, lambda: reference_losses(lm, *span.problem, x.clone().requires_grad_()).mean(), prefix_tensors
    )
    return Run("reference loop", clock, _eval_loss(lm, span, final), mem["mb"], saved, "steps", {"precision": "fp32"})


def _vkv_run(lm: FrozenLM, span: Span, name: str, config: OptimConfig, x: torch.Tensor) -> Run:
    """vkv's optimiser with `config`, its working memory, and what its graph keeps for backward."""
    prefix_tensors = span.prefix.keys + span.prefix.values
    clock = StepClock()
    with working_memory(lm.device) as mem:
        result: OptimResult = optimise(lm, *span.problem, config, on_step=clock)
    precision = "bf16" if uses_bf16(lm, config.precision) else "fp32"
    with lm.compute_weights(torch.bfloat16 if precision == "bf16" else None):  # exist anyway: not kept
        copies = lm.weight_copies() if precision == "bf16" else []
        saved = saved_activation_mb(
            lm, lambda: vkv_loss_and_grad(lm, *span.problem, x, config), prefix_tensors + copies
        )
    settings = {k: getattr(config, k) for k in ("init", "lr", "schedule", "betas")}
    extra = {"precision": precision, "config": settings}
    return Run(name, clock, _eval_loss(lm, span, result.embeddings), mem["mb"], saved, result.stopped, extra)


def _alternate_and_profile(
    lm: FrozenLM, span: Span, x: torch.Tensor, same: OptimConfig, defaults: OptimConfig, step_total_flops: int
) -> tuple[dict[str, float], dict, dict]:
    """One step of each contender and the floor's matmuls timed in alternation, a profile of each step, and the
    compute floor per precision: (median seconds by name, profiles, floors)."""
    n, width = span.targets.k, span.prefix.length + span.targets.k
    default_precision = "bf16" if uses_bf16(lm, defaults.precision) else "fp32"

    def reference_step():
        reference_losses(lm, *span.problem, x.clone().requires_grad_()).mean().backward()

    matmuls = {}
    for precision in sorted({"fp32", default_precision}):
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        matmuls[precision] = (layer_matmuls(lm, n, width, dtype), peak_matmul(lm, dtype))
    same_step, default_step = vkv_step(lm, span, x, same), vkv_step(lm, span, x, defaults)
    with lm.compute_weights(torch.bfloat16 if default_precision == "bf16" else None):  # made once per run
        interleaved = interleaved_step_seconds(
            {
                "reference loop": reference_step,
                "vkv, reference settings": same_step,
                "vkv, defaults": default_step,
                **{f"matmuls {p}": m[0][0] for p, m in matmuls.items()},
                **{f"peak {p}": m[1][0] for p, m in matmuls.items()},
            }
        )
        profiles = {"vkv_defaults": profile_step(default_step)}
    profiles["vkv_reference_settings"] = profile_step(same_step)
    profiles["reference"] = profile_step(reference_step)
    floors = {}
    for precision, ((_, layer_flops), (_, peak_flops)) in matmuls.items():
        at_shapes = layer_flops / interleaved[f"matmuls {precision}"]
        peak = peak_flops / interleaved[f"peak {precision}"]
        floors[precision] = {
            "gflops_at_step_shapes": at_shapes / 1e9,
            "gflops_peak": peak / 1e9,
            "seconds_per_step": step_total_flops / at_shapes,
            "seconds_per_step_at_peak": step_total_flops / peak,
        }
    return interleaved, profiles, floors


def _interleaved_figures(row: dict, interleaved: dict[str, float], floors: dict, reference_steps: int) -> dict:
    """A run's figures from the alternating timing: its step time, speedup, distance from the floor, and time to
    the reference's loss at those step times."""
    step = interleaved[row["run"]]
    reached = row["steps_to_reference_loss"]
    return {
        "interleaved_seconds_per_step": step,
        "interleaved_step_speedup": interleaved["reference loop"] / step,
        "step_over_floor": step / floors[row["precision"]]["seconds_per_step"],
        "interleaved_time_to_loss_speedup": (
            reference_steps * interleaved["reference loop"] / (reached * step) if reached else None
        ),
    }


def _plan_figures(lm: FrozenLM, span: Span) -> dict:
    """The memory plan's estimate for this span, beside the weights as loaded."""
    n = span.targets.k
    estimate = plan(
        lm.model.config,
        quant=lm.quant,
        window=span.end,
        span=span.end - span.start,
        ratio=(span.end - span.start) / n,
        device=lm.device.type,
        precision="fp32",
    )
    return {
        "activations_mb": estimate.activations / 2**20,
        "optimisation_working_mb": estimate.optimisation_working / 2**20,
        "weights_mb": estimate.weights / 2**20,
        "measured_weights_mb": sum(p.numel() * p.element_size() for p in lm.model.parameters()) / 2**20,
    }


def results_tables(records: list[dict]):
    runs = Table(title="vkv optimiser vs a straightforward loop (same span, same loss; one run)")
    for col in (
        "quant",
        "run",
        "precision",
        "s/step in run",
        "s/step alternating",
        "step speedup",
        "÷ floor",
        "steps to ref. loss",
        "s to ref. loss",
        "time-to-loss speedup (wall)",
        "time-to-loss speedup (steps × alternating s/step)",
        "final loss (fp32)",
        "working MiB",
        "kept for backward MiB",
    ):
        runs.add_column(col, justify="left" if col in ("quant", "run", "precision") else "right")
    for rec in records:
        for r in rec["runs"]:
            runs.add_row(
                rec["quant"],
                r["run"],
                r["precision"],
                _fmt(r["seconds_per_step"], 3),
                _fmt(r["interleaved_seconds_per_step"], 3),
                _fmt(r["interleaved_step_speedup"], 2, "×"),
                _fmt(r["step_over_floor"], 2, "×"),
                _fmt(r["steps_to_reference_loss"]),
                _fmt(r["seconds_to_reference_loss"], 1),
                _fmt(r["time_to_loss_speedup"], 2, "×"),
                _fmt(r["interleaved_time_to_loss_speedup"], 2, "×"),
                _fmt(r["final_loss"], 4),
                _fmt(r["working_memory_mb"], 0),
                _fmt(r["saved_for_backward_mb"], 0),
            )
    floor = Table(title="compute floor: matmul FLOPs of a vkv step ÷ this machine's matmul throughput")
    for col in (
        "quant",
        "precision",
        "GFLOP/step",
        "GFLOP/s at step shapes",
        "GFLOP/s peak",
        "floor s/step",
        "floor at peak",
        "matmul share of vkv step",
        "plan: working MiB (fp32)",
    ):
        floor.add_column(col, justify="left" if col in ("quant", "precision") else "right")
    for rec in records:
        f = rec["floor"]
        for precision in ("fp32", "bf16"):
            if precision not in f:
                continue
            profile = rec["profile"][
                "vkv_defaults" if precision != "fp32" or "bf16" not in f else "vkv_reference_settings"
            ]
            floor.add_row(
                rec["quant"],
                precision,
                _fmt(f["gflop_per_step"], 1),
                _fmt(f[precision]["gflops_at_step_shapes"], 1),
                _fmt(f[precision]["gflops_peak"], 1),
                _fmt(f[precision]["seconds_per_step"], 3),
                _fmt(f[precision]["seconds_per_step_at_peak"], 3),
                _fmt(100 * profile["shares"]["matmul (mm, bmm, addmm)"], 0, "%"),
                _fmt(rec["plan"]["optimisation_working_mb"], 0),
            )
    return runs, floor


def _fmt(value, digits: int = 0, suffix: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value}{suffix}"
    return f"{value:.{digits}f}{suffix}"


# ---- the command ---------------------------------------------------------------------------------------


@dataclass
class BenchModel:
    """The one model a benchmark loads (nested in its config: the flags stay `--model`, `--quant`, `--device`)."""

    model: str = setting("smollm2-135m", "alias, directory or hub id")
    quant: str = setting("fp32", "quantisation of the model")
    device: str = setting("cpu", "cpu, cuda, cuda:N or auto")

    def load(self) -> FrozenLM:
        return load_model(self.model, quant=self.quant, device=self.device)


@dataclass
class BenchConfig:
    """`vkv bench optimizer`'s settings."""

    model: str = setting("smollm2-135m", "alias, directory or hub id (default: the test model)")
    quants: tuple[str, ...] = setting(("fp32", "8bit"), "quantisations to run, one model load each")
    device: str = setting("cpu", "cpu, cuda or cuda:N")
    transcript: str | None = setting(None, "default: a bundled transcript, else the test fixture")
    span: str | None = setting(None, "turns:A-B (default: a ~300-token span after a long prefix)")
    ratio: float = setting(DEFAULT_RATIO, "span tokens per virtual token", minimum=1, above=True)
    steps: int = setting(20, "reference-loop steps; its final loss is the target", minimum=1)
    lr: float = setting(OptimConfig().lr, "learning rate of both loops", minimum=0, above=True)
    threads: int = setting(
        1,
        "torch threads (default 1: on a small machine shared with other jobs, multi-threaded "
        "small matmuls stall at their barriers)",
        minimum=1,
    )
    profile: bool = setting(False, "also print the torch.profiler tables")
    json: str = setting("bench-optimizer.json", "where to write the results")


def run_bench(config: BenchConfig) -> int:
    """Every quantisation of `config.quants` benchmarked in turn; prints the tables, writes the JSON."""
    check_ranges(config)
    console = Console(width=None if sys.stdout.isatty() else 200)
    torch.set_num_threads(config.threads)
    transcript, span_spec = config.transcript, config.span
    if transcript is None:
        transcript, default_span = next((p, s) for p, s in DEFAULT_SPANS if p.is_file())
        span_spec = span_spec or default_span
    start = time.perf_counter()
    records = []
    with counted(f"bench optimizer: {len(config.quants)} quantisation(s)", len(config.quants)) as done:
        for quant in config.quants:
            console.print(f"[bold]{config.model} {quant}[/] ({torch.get_num_threads()} thread(s))")
            lm = load_model(config.model, quant=quant, device=config.device)
            span = prepare_span(lm, transcript, span_spec or "turns:3-7", config.ratio)
            console.print(
                f"  span tokens {span.start}-{span.end} → {span.targets.k} virtual tokens on a "
                f"{span.prefix.length}-token prefix"
            )
            records.append(bench_quant(lm, span, config.steps, config.lr, OptimConfig(), log=console.print))
            del lm, span
            gc.collect()
            done()
    runs, floor = results_tables(records)
    console.print(runs)
    tuned = OptimConfig()
    console.print(
        f"vkv defaults: init {tuned.init}, Adam betas {tuned.betas}, lr {tuned.lr:g}, activations "
        f"{tuned.precision} (bf16 on CUDA and on AMX CPUs for unquantised weights); every final loss is "
        "evaluated in fp32. Reference settings: pooled init, betas (0.9, 0.999), fp32."
    )
    console.print(floor)
    if config.profile:
        for rec in records:
            for name, profile in rec["profile"].items():
                console.print(f"[bold]{rec['quant']}: one step, {name.replace('_', ' ')}[/]\n{profile['table']}")
    seconds = time.perf_counter() - start
    console.print(f"benchmark took {seconds:.0f} s")
    write_json_atomic(config.json, {"model": config.model, "seconds": seconds, "records": records})
    console.print(f"wrote {config.json}")
    return 0
