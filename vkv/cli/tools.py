"""`vkv doctor`, `vkv bench` and `vkv plan`: checks, speed and memory of this machine and model."""

from __future__ import annotations

import argparse

from vkv.cli.common import add_model_args, console, key_value_table, load_from_args, write_json


def cmd_doctor(args: argparse.Namespace) -> int:
    from vkv.tools.doctor import check

    lm = load_from_args(args)
    report = check(lm)
    console.print(key_value_table("vkv doctor", report))
    write_json(args.json, report)
    if not report["ok"]:
        console.print("[red]doctor: gradients did not reach the input embeddings, or model weights are trainable[/]")
        return 1
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench_command == "cache":
        from vkv.tools.bench_cache import run_bench_cache

        return run_bench_cache(args)
    from vkv.tools.bench import run_bench

    return run_bench(args)


def cmd_plan(args: argparse.Namespace) -> int:
    from vkv.tools.memory import run_plan

    return run_plan(args)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="load a model and check gradients flow to the input embeddings")
    p.set_defaults(run=cmd_doctor, outputs=("json",))
    add_model_args(p)
    p.add_argument("--json", help="also write the report to this file")

    from vkv.tools.bench import add_bench_args
    from vkv.tools.bench_cache import add_bench_cache_args
    from vkv.tools.memory import add_plan_args

    p = sub.add_parser("bench", help="benchmarks")
    p.set_defaults(run=cmd_bench, outputs=("json",))
    bsub = p.add_subparsers(dest="bench_command", required=True)
    add_bench_args(bsub.add_parser("optimizer", help="vkv's optimiser vs a straightforward loop and the compute floor"))
    add_bench_cache_args(
        bsub.add_parser("cache", help="bytes, peak memory and decode time of compressed caches: padded vs ragged")
    )
    p = sub.add_parser("plan", help="memory budget of a compression run, computed from the model config")
    p.set_defaults(run=cmd_plan, outputs=("json",))
    add_plan_args(p)
