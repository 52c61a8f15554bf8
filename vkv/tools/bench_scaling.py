"""`vkv bench scaling`: how each method's compression cost grows with the context.

One process, one model: for each length L, the window is the first L tokens of one long transcript and the span
everything in it after the system message (cut inside a message where L falls there: these transcripts hold tool
outputs of a thousand tokens and more, so message boundaries would not give the lengths asked for). The
full-context pass every method is given is run once and timed (the prefill), then each method compresses the span at
one ratio: its seconds and the peak memory it adds (peak RSS on CPU, peak allocation on CUDA). Per method, the
exponent of time against span length is the slope of a least-squares line through (log length, log seconds): 1 is
linear, 2 quadratic. For vkv the segment's phase times say which part grows fastest: the pooled targets, the span's
read-out queries (head-wise budgets, fitted biases), the optimiser's steps, the virtual tokens' K/V, the biases.
A benchmark to run and read, not a timed test.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.io import write_json_atomic
from vkv.kv.segment import SegmentGroup
from vkv.lm.frozen import FrozenLM
from vkv.methods import METHODS, get_method
from vkv.progress import counted
from vkv.settings import check_ranges, nested, setting
from vkv.text.transcript import load_transcript, render
from vkv.tools.bench_model import BenchModel
from vkv.tools.measure import working_memory

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRANSCRIPT = ROOT / "transcripts" / "dev" / "flaky-ci-debugging.json"  # 11.5k tokens on the test model


@dataclass
class ScalingBenchConfig:
    model: BenchModel = nested(BenchModel)
    transcript: str = setting(str(DEFAULT_TRANSCRIPT), "a transcript at least as long as the longest window")
    lengths: tuple[int, ...] = setting(
        (512, 1024, 2048, 4096, 7680), "window lengths in tokens (the transcript's first tokens)", minimum=64
    )
    methods: tuple[str, ...] = setting(("truncate", "knorm", "snapkv", "am", "kvzip", "vkv"), "methods to time")
    ratio: float = setting(8.0, "the ratio every method compresses at", minimum=1, above=True)
    threads: int = setting(1, "torch threads", minimum=1)
    seed: int = setting(0, "seed of the methods", minimum=0)
    json: str = setting("bench-scaling.json", "where to write the results")
    plot: str | None = setting(None, "also draw seconds against span length, log-log (PNG; needs matplotlib)")

    def validate(self) -> ScalingBenchConfig:
        check_ranges(self)
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise VkvError(f"field methods: unknown method '{unknown[0]}'; choose from {', '.join(METHODS)}")
        if not Path(self.transcript).is_file():
            raise VkvError(f"field transcript: no such transcript {self.transcript}")
        return self


def window_work(lm: FrozenLM, transcript, rendered, length: int, seed: int, field: str) -> SpanWork:
    """What every method is given for the window of the first `length` tokens of a rendered transcript (its
    full-context pass included): the span is everything after the system message, cut inside a message where `length`
    falls there. `field`: the setting that chose `length`, named when it does not fit."""
    start = rendered.token_span(*transcript.default_span())[0]
    if length > len(rendered.ids) or length <= start:
        raise VkvError(
            f"{transcript.path or transcript.id}: field {field}: {length} tokens do not fit its {len(rendered.ids)} "
            f"tokens after its {start}-token system message; choose {field} between {start + 1} and {len(rendered.ids)}"
        )
    return SpanWork.capture(lm, rendered.ids, start, length, rendered.message_starts, rendered.message_roles, seed)


def measure(lm: FrozenLM, config: ScalingBenchConfig, length: int, log) -> list[dict[str, Any]]:
    """The prefill and every method of `config` on the first `length` tokens of `config.transcript`."""
    transcript = load_transcript(config.transcript)
    rendered = render(transcript, lm.tokenizer)
    with working_memory(lm.device) as peak:
        started = time.perf_counter()
        work = window_work(lm, transcript, rendered, length, config.seed, "lengths")
        prefill = time.perf_counter() - started
    start, end = work.start, work.end
    log(f"{transcript.id}: first {end} tokens, span {end - start}; prefill {prefill:.1f} s")
    base = {"window": f"{transcript.id}[:{end}]", "window_tokens": end, "span_tokens": end - start}
    records = [{**base, "method": "prefill", "seconds": round(prefill, 3), "peak_mb": round_mb(peak["mb"])}]
    for name in config.methods:
        torch.manual_seed(config.seed)
        try:
            with working_memory(lm.device) as peak:
                started = time.perf_counter()
                result = get_method(name).compress(work, config.ratio)
                seconds = time.perf_counter() - started
        except VkvError as exc:  # refused at this length (e.g. past the model's positions): the others go on
            records.append({**base, "method": name, "error": str(exc)})
            log(f"  {name}: refused: {exc}")
            continue
        segments = list(result) if isinstance(result, SegmentGroup) else [result]
        phases = segments[0].stats.get("phase_seconds") if len(segments) == 1 else None
        records.append(
            {**base, "method": name, "seconds": round(seconds, 3), "peak_mb": round_mb(peak["mb"]), "phases": phases}
        )
        log(f"  {name}: {seconds:.1f} s, peak +{mb_text(peak['mb'])} MB" + (f", phases {phases}" if phases else ""))
    return records


def exponents(records: list[dict]) -> dict[str, float | None]:
    """Per method, the slope of log seconds against log span length (None with fewer than two lengths)."""
    out: dict[str, float | None] = {}
    for name in dict.fromkeys(r["method"] for r in records):
        points = [(r["span_tokens"], r["seconds"]) for r in records if r["method"] == name and r.get("seconds", 0) > 0]
        if len({n for n, _ in points}) < 2:
            out[name] = None
            continue
        x, y = np.log([n for n, _ in points]), np.log([s for _, s in points])
        out[name] = round(float(np.polyfit(x, y, 1)[0]), 3)
    return out


def phase_exponents(records: list[dict]) -> dict[str, dict[str, float | None]]:
    """For methods that report phase times (vkv), the exponent of each phase's seconds against span length."""
    out = {}
    for name in dict.fromkeys(r["method"] for r in records if r.get("phases")):
        rows = [r for r in records if r["method"] == name and r.get("phases")]
        phases = rows[0]["phases"]
        out[name] = exponents(
            [{"method": p, "span_tokens": r["span_tokens"], "seconds": r["phases"][p]} for r in rows for p in phases]
        )
    return out


def table(records: list[dict], fitted: dict[str, float | None]) -> Table:
    lengths = sorted({r["span_tokens"] for r in records})
    t = Table(title="compression seconds (peak MB added) against span length, one process; exponent: log-log slope")
    t.add_column("method")
    for n in lengths:
        t.add_column(f"{n} tokens", justify="right")
    t.add_column("exponent", justify="right")
    for name, exponent in fitted.items():
        cells = {r["span_tokens"]: r for r in records if r["method"] == name}
        row = [_seconds_cell(cells.get(n)) for n in lengths]
        t.add_row(name, *row, "—" if exponent is None else f"{exponent:.2f}")
    return t


def draw(records: list[dict], fitted: dict[str, float | None], path: str) -> bool:
    """Seconds against span length, log-log, one line per method; False without matplotlib."""
    try:
        import matplotlib  # optional dependency (vkv[plots])

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # optional dependency, as above
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, exponent in fitted.items():
        pts = sorted((r["span_tokens"], r["seconds"]) for r in records if r["method"] == name and "seconds" in r)
        label = name if exponent is None else f"{name} (exponent {exponent:.2f})"
        ax.plot([n for n, _ in pts], [s for _, s in pts], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("span tokens compressed")
    ax.set_ylabel("seconds")
    ax.set_title("compression time against context length")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def run_bench_scaling(config: ScalingBenchConfig) -> int:
    """Every length of `config` in turn on one loaded model; prints the table and the exponents, writes the JSON."""
    config.validate()
    console = Console(width=None if sys.stdout.isatty() else 200)
    torch.set_num_threads(config.threads)
    started = time.perf_counter()
    lm = config.model.load()
    records: list[dict[str, Any]] = []
    with counted(f"bench scaling: {len(config.lengths)} length(s)", len(config.lengths)) as done:
        for i, length in enumerate(sorted(config.lengths), 1):
            console.print(f"[bold]length {i}/{len(config.lengths)}[/] (~{length} tokens)")
            records += measure(lm, config, length, console.print)
            done()
    fitted, phases = exponents(records), phase_exponents(records)
    console.print(table(records, fitted))
    for name, per_phase in phases.items():
        console.print(f"{name} phase exponents: " + ", ".join(f"{p} {e}" for p, e in per_phase.items()))
    if config.plot and draw(records, fitted, config.plot):
        console.print(f"wrote {config.plot}")
    seconds = time.perf_counter() - started
    summary = {
        "model": config.model.model,
        "device": str(lm.device),
        "seconds": round(seconds, 1),
        "config": asdict(config),
    }
    write_json_atomic(config.json, {**summary, "exponents": fitted, "phase_exponents": phases, "records": records})
    console.print(f"benchmark took {seconds:.0f} s; wrote {config.json}")
    return 0


def _seconds_cell(record: dict | None) -> str:
    if record is None:
        return "—"
    if "error" in record:
        return "refused"
    return f"{record['seconds']:.2f} ({mb_text(record['peak_mb'])})"


def round_mb(mb: float | None) -> float | None:
    return None if mb is None else round(mb, 1)


def mb_text(mb: float | None) -> str:
    return "—" if mb is None or math.isnan(mb) else f"{mb:.0f}"
