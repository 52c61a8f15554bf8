"""Running a sweep's runs: one model load per model/quant, one TranscriptEval (full and none references) per
window, then every run on it in grid order; each finished run appended to the results file at once."""

from __future__ import annotations

import gc
import itertools
import platform
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.file import cache_metadata, save_cache, transcript_record
from vkv.lm.load import load_model
from vkv.methods import METHODS
from vkv.progress import status
from vkv.resources import peak_memory_mb, reset_peak_memory
from vkv.sweep.grid import Experiment, build_method
from vkv.sweep.plan import Run
from vkv.sweep.results import ResultsFile
from vkv.text.transcript import render


def git_revision() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return {"revision": None, "dirty": None}
    if rev.returncode != 0:
        return {"revision": None, "dirty": None}
    return {"revision": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


class SweepEval(TranscriptEval):
    """A TranscriptEval that remembers the last spliced cache it scored (for --save-caches) and how long its
    references took."""

    keep_spliced = False
    last_spliced = None
    reference_seconds: float | None = None

    def splice(self, segment):
        spliced = super().splice(segment)
        if self.keep_spliced:
            self.last_spliced = spliced
        return spliced


@dataclass
class SweepContext:
    experiment: Experiment
    out: Path
    shard: tuple[int, int]
    device: str
    attn: str
    save_caches: bool
    git: dict
    batch: int  # questions scored side by side (0: each alone): no part of a run's identity


def execute(
    ctx: SweepContext,
    runs: list[Run],
    results: ResultsFile,
    console,
    progress,
    on_failure: Callable[[dict], None] = lambda failure: None,
) -> list[dict]:
    """Run `runs` (grouped by model, then unit), appending a line per finished run; returns the failures
    (each also passed to `on_failure` as it happens)."""
    failures = _Failures(on_failure)
    overall = progress.add_task("sweep", total=len(runs), loss="")
    for (model, quant), group in itertools.groupby(runs, key=lambda r: r.group):
        group = list(group)
        lm = _load(model, quant, ctx, console)
        for _, unit_runs in itertools.groupby(group, key=lambda r: r.unit.label):
            unit_runs = list(unit_runs)
            evaluation = _references(lm, unit_runs[0], ctx, progress, failures)
            for run in unit_runs:
                if evaluation is not None:
                    _one_run(ctx, lm, evaluation, run, results, progress, failures)
                progress.advance(overall)
        del lm
        _free_memory()
    return list(failures)


class _Failures(list):
    def __init__(self, on_failure: Callable[[dict], None]):
        super().__init__()
        self.on_failure = on_failure

    def append(self, failure: dict) -> None:
        super().append(failure)
        self.on_failure(failure)


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _load(model: str, quant: str, ctx: SweepContext, console):
    with status(f"loading {model} ({quant})"):
        return load_model(model, quant=quant, device=ctx.device, attn_implementation=ctx.attn)


def _references(lm, run: Run, ctx: SweepContext, progress, failures: list) -> SweepEval | None:
    task = progress.add_task(f"{run.unit.label}: full and none references", total=None, loss="")
    try:
        settings = EvalSettings(**run.identity["eval"], seed=run.point["seed"], batch=ctx.batch)
        started = time.perf_counter()
        evaluation = SweepEval(lm, run.unit.transcript, run.unit.turns, settings)
        evaluation.keep_spliced = ctx.save_caches
        evaluation.reference_seconds = round(time.perf_counter() - started, 3)
    except VkvError as exc:
        failures.append({"unit": run.unit.label, "error": str(exc)})
        return None
    finally:
        progress.remove_task(task)
    return evaluation


def _one_run(ctx: SweepContext, lm, evaluation, run: Run, results: ResultsFile, progress, failures: list) -> None:
    point = run.point
    label = f"{run.unit.label} {point['method']}" + (f" @ {point['ratio']}×" if point["ratio"] else "")
    reports_steps = METHODS[point["method"]].reports_steps
    steps = run.identity["config"].get("optim", {}).get("steps") if reports_steps else None
    task = progress.add_task(label, total=steps or None, loss="—")

    def on_step(step: int, loss: float) -> None:
        progress.update(task, completed=step, loss=f"{loss:.4f}")

    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        method = build_method(point)
        evaluation.settings.seed = point["seed"]  # evaluate() seeds torch from it; references do not depend on it
        evaluation.work.seed = point["seed"]
        torch.manual_seed(point["seed"])
        reset_peak_memory(lm.device)
        t0 = time.perf_counter()
        result = evaluation.evaluate(method, point["ratio"], on_step)
        wall = time.perf_counter() - t0
    except (VkvError, RuntimeError, ValueError, NotImplementedError) as exc:  # record, keep going with the grid
        failures.append(
            {
                "run_id": run.id,
                "unit": run.unit.label,
                "method": point["method"],
                "ratio": point["ratio"],
                "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                "where": traceback.format_exc(limit=-3).strip().splitlines()[-3:],
            }
        )
        progress.remove_task(task)
        _free_memory()  # after an out-of-memory error the next run should start clean
        return
    record = {
        "run_id": run.id,
        "sweep": ctx.experiment.name,
        "experiment": str(ctx.experiment.path),
        "run": point,
        "identity": run.identity,
        "git": ctx.git,
        "seed": point["seed"],
        "started": started,
        "wall_seconds": round(wall, 3),
        "reference_seconds": evaluation.reference_seconds,
        "peak_memory_mb": round(peak_memory_mb(lm.device), 1),
        "peak_memory_kind": "cuda-max-allocated" if lm.device.type == "cuda" else "process-max-rss",
        "device": str(lm.device),
        "threads": torch.get_num_threads(),
        "batch": ctx.batch,
        "torch": torch.__version__,
        "host": platform.node(),
        "shard": f"{ctx.shard[0]}/{ctx.shard[1]}",
        "result": result,
    }
    if ctx.save_caches and evaluation.last_spliced is not None and point["method"] not in ("full", "none"):
        record["cache"] = _save_cache(ctx, lm, run, evaluation.last_spliced, result)
    results.append(record)
    progress.remove_task(task)
    summary = result["summary"]
    progress.console.print(
        f"done {label}: keyword {summary['keyword_accuracy']:.2f}, choice "
        f"{summary['choice_accuracy']:.2f}, achieved {result['ratio_achieved'] or 0:.2f}×, "
        f"{wall:.1f}s",
        highlight=False,
    )


def _save_cache(ctx: SweepContext, lm, run: Run, spliced, result: dict) -> str:
    path = ctx.out / "caches" / f"{run.id}.safetensors"
    t = run.unit.transcript
    record = transcript_record(t, result["turns"], len(render(t, lm.tokenizer).ids))
    spliced.meta = cache_metadata(lm, transcript=record, config=result["config"])
    save_cache(spliced, path)
    return str(path.relative_to(ctx.out))
