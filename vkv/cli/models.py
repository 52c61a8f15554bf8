"""`vkv models`: list the aliases vkv knows and fetch them.

The alias to fetch is `vkv models fetch`'s positional argument (hand-written: it is not a setting); its flag is the
field of `FetchConfig`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rich.table import Table

from vkv.cli.common import console
from vkv.lm import zoo
from vkv.settings import add_arguments, from_args, setting


@dataclass
class FetchConfig:
    force: bool = setting(False, "fetch again even if present")


def cmd_models(args: argparse.Namespace) -> int:

    if args.models_command == "fetch":
        zoo.fetch(args.name, force=from_args(FetchConfig, args).force, log=console.print)
        return 0
    table = Table(title="models vkv can fetch")
    for col in ("alias", "fetched", "path", "description"):
        table.add_column(col)
    for alias, source in zoo.ZOO.items():
        table.add_row(alias, "yes" if zoo.is_fetched(alias) else "no", str(zoo.model_path(alias)), source.description)
    console.print(table)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list or fetch models vkv knows by alias")
    p.set_defaults(run=cmd_models)
    msub = p.add_subparsers(dest="models_command")
    f = msub.add_parser("fetch", help="download and convert a model into $VKV_HOME/models")
    f.add_argument("name")
    add_arguments(f, FetchConfig)
    msub.add_parser("list", help="list aliases")
