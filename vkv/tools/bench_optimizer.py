"""`vkv bench optimizer`: vkv's optimiser against a straightforward loop on the same span, in one run.

The contenders are in `vkv.tools.optimizer_steps`, the runs on one model in `vkv.tools.optimizer_runs`. Because a
shared machine's load drifts over minutes, one step of each (and the floor's matmuls) are also timed in alternation,
round robin; those ratios are the robust ones. Next to them: the compute floor (the matmul FLOPs one step needs
divided by the throughput measured on this machine at the step's shapes), peak working memory, the memory plan's
estimate, and a profile of each step.
"""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console

from vkv.compress.budget import DEFAULT_RATIO
from vkv.compress.optimise import OptimConfig
from vkv.io import write_json_atomic
from vkv.lm.load import load_model
from vkv.progress import counted
from vkv.settings import check_ranges, setting
from vkv.tools.optimizer_runs import bench_quant
from vkv.tools.optimizer_steps import prepare_span
from vkv.tools.optimizer_tables import results_tables

ROOT = Path(__file__).resolve().parents[2]


DEFAULT_SPANS = [  # a span of a few hundred tokens after a long prefix; the fixture when the transcripts are absent
    (ROOT / "transcripts" / "dev" / "taskapi-express-sqlite.json", "turns:8-9"),
    (ROOT / "tests" / "fixtures" / "mini-agent.json", "turns:3-7"),
]


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
