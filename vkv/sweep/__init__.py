"""Experiment grids from TOML, run once each: resumable, crash-safe, shardable across processes or GPUs.

An experiment file (every value may be a scalar or a list; a list is an axis of the grid):

    name = "cpu-quick"                  # optional; default: the file's stem
    description = "what it reproduces"
    [defaults]                          # inherited by every [[grid]] table
    model = "smollm2-135m"              # alias, hub id or directory
    quant = "fp32"                      # auto resolves per device (8bit on CUDA, fp32 on CPU)
    transcripts = ["../transcripts/dev/taskapi-express-sqlite.json"]   # relative to the TOML file
    window = 512                        # turn windows of ≤ N tokens; or window_turns = N messages;
                                        # or span = "turns:A-B" of the whole transcript; or none: default span
    max_windows = 1                     # per transcript: the windows with the most questions
    seeds = 0
    [eval]                              # EvalSettings: min_gap, max_new_tokens
    [[grid]]                            # union of grids; each is a cartesian product
    methods = ["truncate", "vkv"]
    ratios = [2.0, 3.2]
    pooling = ["uniform", "surprisal"]  # CompressConfig and OptimConfig fields: positions, target, steps, lr, ...
    snapkv = { window = 32 }            # options of one method, under its name (hybrid.fraction, ...)
    vkv = { per_turn = true }           # vkv per turn: the method older files name sequential (same run ids)

Options a method does not take are dropped from its runs (so `pooling` does not multiply `truncate` runs)
and identical runs are kept once. A run's id is a hash of everything that decides its result: model,
resolved quantisation, the evaluated window (transcript id, content hash, turns), method, ratio, the
method's fully resolved config, seed and eval settings; the code revision is recorded, not hashed.

`vkv sweep` appends one JSON line per finished run to OUT/results.jsonl (OUT/results.rank{i}.jsonl when
sharded) with one `os.write` on an O_APPEND descriptor followed by fsync, so `kill -9` loses at most the run
in flight; on start a trailing partial line is cut off and every run already in any results file is skipped.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings
from vkv.progress import make_progress, status
from vkv.settings import check_ranges, setting, threads_setting
from vkv.sweep.grid import UNIT_KEYS, Experiment, build_method, expand, load_experiment
from vkv.sweep.plan import Run, Unit, parse_shard, plan, take_shard, turn_count_windows
from vkv.sweep.results import ResultsFile, read_results, results_name
from vkv.sweep.runner import SweepContext, execute, git_revision

__all__ = [
    "Experiment",
    "ResultsFile",
    "Run",
    "SweepConfig",
    "Unit",
    "build_method",
    "expand",
    "load_experiment",
    "parse_shard",
    "plan",
    "read_results",
    "results_name",
    "run_sweep",
    "take_shard",
    "turn_count_windows",
]


@dataclass
class SweepConfig:
    """How `vkv sweep` runs an experiment file (its flags; the grid itself comes from the file)."""

    out: str | None = setting(None, "directory for results.jsonl (created; re-running resumes)", required=True)
    shard: str | None = setting(None, "i/n: run every n-th run of the grid (default: RANK/WORLD_SIZE if set)")
    save_caches: bool = setting(False, "also save each run's spliced cache (large)")
    device: str = setting("auto", "cpu, cuda, cuda:N or auto (torchrun: cuda:LOCAL_RANK)")
    attn: str = setting("sdpa", "attention implementation", choices=("sdpa", "eager"))
    threads: int | None = threads_setting()
    batch: int = setting(
        EvalSettings.batch,
        "questions scored side by side on one context (0: each alone); the speed changes, not a run's numbers beyond "
        "float rounding, so it is recorded with each run but is no part of its id",
        minimum=0,
    )
    dry_run: bool = setting(False, "list the runs this shard would do, then stop")

    def validate(self) -> SweepConfig:
        if not self.out:
            raise VkvError("--out is required: the directory for results.jsonl")
        check_ranges(self)
        return self


def _device(arg: str) -> str:

    local = os.environ.get("LOCAL_RANK")
    if arg == "auto" and local is not None and torch.cuda.is_available():
        return f"cuda:{local}"
    return arg


def run_sweep(experiment_path: str | Path, config: SweepConfig) -> int:
    """Run the experiment file's grid (this shard's runs not yet in the results files); 1 if any run failed."""
    console = Console()
    if not console.is_terminal:  # piped or captured: wide enough for the tables
        console = Console(width=200)
    config.validate()
    experiment = load_experiment(experiment_path)
    shard = parse_shard(config.shard)
    device = _device(config.device)
    out = Path(config.out)
    with status(f"{experiment.path}: expanding the grid"):
        runs = plan(experiment, device)
    mine = take_shard(runs, *shard)
    done = {line.get("run_id") for line in read_results(out)} if out.is_dir() else set()
    pending = [r for r in mine if r.id not in done]
    split = "+".join(sorted({r.unit.transcript.split or "unsplit" for r in runs})) or "—"
    console.print(
        f"{experiment.name} (transcript split: {split}): {len(runs)} runs in the grid, {len(mine)} in shard "
        f"{shard[0]}/{shard[1]}, {len(mine) - len(pending)} already done, {len(pending)} to run"
    )
    if config.dry_run:
        _print_plan(console, pending)
        return 0
    if not pending:
        return 0
    if config.save_caches:  # a key that cannot sign the caches is one sentence now, not a failure after each run
        from vkv.kv.sign import check_key

        check_key()

    if config.threads:
        torch.set_num_threads(config.threads)
    results = ResultsFile(out / results_name(*shard))
    errors = out / results_name(*shard).replace("results", "errors")
    ctx = SweepContext(experiment, out, shard, device, config.attn, config.save_caches, git_revision(), config.batch)
    try:
        with make_progress() as progress:
            failures = execute(ctx, pending, results, console, progress, lambda f: _log_failure(errors, f))
    finally:
        results.close()
    for failure in failures:
        console.print(
            f"[bold red]failed:[/] {failure.get('unit')} {failure.get('method', '')} "
            f"{failure.get('ratio') or ''}: {failure['error']}",
            highlight=False,
        )
    console.print(f"wrote {results.path}" + (f"; {len(failures)} failed (see {errors})" if failures else ""))
    return 1 if failures else 0


def _log_failure(path: Path, failure: dict) -> None:
    """Failed runs go to errors*.jsonl as they happen (they are not finished, so the next sweep retries them)."""
    log = ResultsFile(path)
    try:
        log.append({**failure, "at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    finally:
        log.close()


def _print_plan(console, runs: list[Run]) -> None:
    table = Table(title="planned runs")
    for col in ("run id", "model", "quant", "unit", "method", "ratio", "seed", "options"):
        table.add_column(col)
    skip = {"model", "quant", "transcript", "method", "ratio", "seed", *UNIT_KEYS}
    for r in runs:
        options = " ".join(f"{k}={v}" for k, v in r.point.items() if k not in skip)
        table.add_row(
            r.id,
            r.point["model"],
            r.identity["quant"],
            r.unit.label,
            r.point["method"],
            str(r.point["ratio"] or "—"),
            str(r.point["seed"]),
            options,
        )
    console.print(table)
