"""`vkv sweep` and `vkv report`: run an experiment grid resumably, and turn its results into tables."""

from __future__ import annotations

import argparse


def cmd_sweep(args: argparse.Namespace) -> int:
    from vkv.sweep import run_sweep

    return run_sweep(args)


def cmd_report(args: argparse.Namespace) -> int:
    from vkv.sweep.report import run_report

    return run_report(args)


def register(sub: argparse._SubParsersAction) -> None:
    from vkv.sweep import add_sweep_args
    from vkv.sweep.report import add_report_args

    p = sub.add_parser("sweep", help="run an experiment grid (experiments/*.toml) resumably; --shard i/n")
    p.set_defaults(run=cmd_sweep)
    add_sweep_args(p)
    p = sub.add_parser("report", help="tables, PNG plots and report.md from a sweep's results")
    p.set_defaults(run=cmd_report)
    add_report_args(p)
