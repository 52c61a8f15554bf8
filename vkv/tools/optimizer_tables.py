"""`vkv bench optimizer`'s tables: each run against the reference loop, and the compute floor."""

from __future__ import annotations

from rich.table import Table


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
