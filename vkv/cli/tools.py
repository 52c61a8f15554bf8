"""`vkv doctor`, `vkv bench` and `vkv plan`: checks, speed and memory of this machine and model.

Every flag is a field of the command's config: `DoctorConfig` (here), `BenchConfig` (vkv.tools.bench_optimizer),
`CacheBenchConfig` (vkv.tools.bench_cache), `ScalingBenchConfig` (vkv.tools.bench_scaling), `CompressBenchConfig`
(vkv.tools.bench_compress) and `PlanConfig` (vkv.tools.memory)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from vkv.cli.common import ModelConfig, console, key_value_table, load_model_from, write_json
from vkv.settings import add_arguments, from_args, nested, setting
from vkv.tools.bench_cache import CacheBenchConfig, run_bench_cache
from vkv.tools.bench_compress import CompressBenchConfig, run_bench_compress
from vkv.tools.bench_optimizer import BenchConfig, run_bench
from vkv.tools.bench_scaling import ScalingBenchConfig, run_bench_scaling
from vkv.tools.doctor import check
from vkv.tools.memory import PlanConfig, run_plan
from vkv.tools.method_memory import run_method_plans


@dataclass
class DoctorConfig:
    model: ModelConfig = nested(ModelConfig)
    json: str | None = setting(None, "also write the report to this file")


def cmd_doctor(args: argparse.Namespace) -> int:

    config = from_args(DoctorConfig, args)
    lm = load_model_from(config.model)
    report = check(lm)
    console.print(key_value_table("vkv doctor", report))
    write_json(config.json, report)
    if not report["ok"]:
        console.print("[red]doctor: gradients did not reach the input embeddings, or model weights are trainable[/]")
        return 1
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench_command == "cache":
        return run_bench_cache(from_args(CacheBenchConfig, args))
    if args.bench_command == "compress":
        return run_bench_compress(from_args(CompressBenchConfig, args))
    if args.bench_command == "scaling":
        return run_bench_scaling(from_args(ScalingBenchConfig, args))
    return run_bench(from_args(BenchConfig, args))


def cmd_plan(args: argparse.Namespace) -> int:
    config = from_args(PlanConfig, args)
    return run_plan(config) if config.method is None else run_method_plans(config)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="load a model and check gradients flow to the input embeddings")
    p.set_defaults(run=cmd_doctor, outputs=("json",))
    add_arguments(p, DoctorConfig)

    p = sub.add_parser("bench", help="benchmarks")
    p.set_defaults(run=cmd_bench, outputs=("json",))
    bsub = p.add_subparsers(dest="bench_command", required=True)
    optimizer = bsub.add_parser("optimizer", help="vkv's optimiser vs a straightforward loop and the compute floor")
    add_arguments(optimizer, BenchConfig)
    cache = bsub.add_parser("cache", help="bytes, peak memory and decode time of compressed caches: padded vs ragged")
    add_arguments(cache, CacheBenchConfig)
    scaling = bsub.add_parser(
        "scaling", help="each method's compression seconds and peak memory against context length"
    )
    add_arguments(scaling, ScalingBenchConfig)
    compress = bsub.add_parser(
        "compress",
        help="seconds of each stage and peak host and device memory of each method on one window; --shape: a "
        "shipped architecture with random weights",
    )
    add_arguments(compress, CompressBenchConfig)
    p = sub.add_parser("plan", help="memory budget of a compression run, computed from the model config")
    p.set_defaults(run=cmd_plan, outputs=("json",))
    add_arguments(p, PlanConfig)
