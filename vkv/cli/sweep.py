"""`vkv sweep` and `vkv report`: run an experiment grid resumably, and turn its results into tables.

The experiment file and the results directory are positional arguments (hand-written here: they are not
settings); every flag is a field of `SweepConfig` or `ReportConfig`."""

from __future__ import annotations

import argparse

from vkv.settings import add_arguments, from_args
from vkv.sweep import SweepConfig, run_sweep
from vkv.sweep.report import ReportConfig, run_report


def cmd_sweep(args: argparse.Namespace) -> int:
    return run_sweep(args.config, from_args(SweepConfig, args))


def cmd_report(args: argparse.Namespace) -> int:
    return run_report(args.dir, from_args(ReportConfig, args), force=args.force)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run an experiment grid (experiments/*.toml) resumably; --shard i/n")
    p.set_defaults(run=cmd_sweep)
    p.add_argument("config", help="experiment file (experiments/*.toml)")
    add_arguments(p, SweepConfig)
    p = sub.add_parser("report", help="tables, PNG plots and report.md from a sweep's results")
    p.set_defaults(run=cmd_report, output_dirs=("out",))  # its files are checked by run_report, which names them
    p.add_argument("dir", help="a sweep's --out directory")
    add_arguments(p, ReportConfig)
