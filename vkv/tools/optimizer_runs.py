"""`vkv bench optimizer` on one loaded model: the reference loop and vkv's optimiser twice (with the reference's
settings, the same trajectory, so the difference is the cost of a step; and with its defaults, stopping once it
reaches the reference's final loss), one step of each and the floor's matmuls timed in alternation, the compute
floor, peak working memory, the memory plan's estimate, and a profile of each step."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from vkv.compress.kv_loss import Batch
from vkv.compress.optimise import OptimConfig, OptimResult, optimise
from vkv.compress.precision import uses_bf16
from vkv.lm.frozen import FrozenLM
from vkv.tools.compute_floor import layer_matmuls, peak_matmul, step_flops
from vkv.tools.measure import StepClock, interleaved_step_seconds, profile_step, saved_activation_mb, working_memory
from vkv.tools.memory import plan
from vkv.tools.optimizer_steps import Span, reference_losses, reference_optimise, vkv_loss_and_grad, vkv_step


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
