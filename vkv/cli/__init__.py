"""The `vkv` command line: one module per command, each adding its parser with `register(sub)`; rich tables for
people, `--json FILE` for machines, one-sentence errors."""

from __future__ import annotations

import argparse
import sys

from rich.markup import escape

from vkv.cli import ask, chat, compress, inspect, models, prune, render, sweep, tools, validate
from vkv.cli import eval as eval_command
from vkv.cli.common import errors
from vkv.cli.compress import compress_config_from_args
from vkv.errors import VkvError

COMMAND_MODULES = (models, tools, render, compress, inspect, ask, chat, eval_command, validate, sweep, prune)
MODEL_OPTIONAL = ("ask", "chat", "validate")  # these default --model to what the cache or transcripts record


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vkv",
        description="Compress a coding agent's conversation at the model's representation layer; compare it with "
        "text-level and KV-cache methods on the same factual-recall eval.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "model", "unset") is None and args.command not in MODEL_OPTIONAL:
        from vkv.lm.load import DEFAULT_MODEL

        args.model = DEFAULT_MODEL
    try:
        return args.run(args) or 0
    except VkvError as exc:
        errors.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)  # a path or [[grid]] is not markup
        return 2
    except KeyboardInterrupt:
        errors.print("[yellow]interrupted[/]")
        return 130


__all__ = ["build_parser", "compress_config_from_args", "main"]

if __name__ == "__main__":
    sys.exit(main())
