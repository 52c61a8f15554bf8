"""The `vkv` command line: one module per command, each adding its parser with `register(sub)`; rich tables for
people, `--json FILE` for machines, one-sentence errors.

Every flag is a field of a config dataclass (vkv.settings: `add_arguments` makes the flags, `from_args` builds the
config back); only positional arguments (files) are hand-written. This package is the only code that sees an
`argparse.Namespace`: a command's `cmd_*` function builds its config and hands it, with plain values, to the library.
Building the parser reads every config and method registry, which imports torch and transformers anyway, so command
modules import what they use at the top like the rest of the package."""

from __future__ import annotations

import argparse
import json
import os
import sys

from rich.markup import escape

from vkv.cli import ask, chat, compress, inspect, models, prune, render, sweep, tools, validate
from vkv.cli import eval as eval_command
from vkv.cli.common import errors
from vkv.cli.compress import recipe_from_args
from vkv.errors import VkvError
from vkv.io import check_writable
from vkv.lm.load import DEFAULT_MODEL, resolve_model_path

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
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help, or argparse refusing a flag in one line: its exit code is returned
        return exit_.code if isinstance(exit_.code, int) else 2
    if getattr(args, "model", "unset") is None and args.command not in MODEL_OPTIONAL:
        args.model = DEFAULT_MODEL
    try:
        if isinstance(getattr(args, "model", None), str):  # a misspelled alias fails now, not after loading anything
            resolve_model_path(args.model)
        for name in getattr(args, "outputs", ()):  # files the command will write: refused now, not after the work
            if getattr(args, name, None):
                check_writable(getattr(args, name), "--" + name.replace("_", "-"))
        return args.run(args) or 0
    except KeyboardInterrupt:
        errors.print("[yellow]interrupted[/]")
        return 130
    except Exception as exc:
        message = one_sentence(exc)
        if message is None or os.environ.get("VKV_DEBUG") == "1":
            raise  # a bug: its traceback is what a report needs
        errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False)  # a path or [[grid]] is not markup
        return 2


def one_sentence(exc: BaseException) -> str | None:
    """What the user did wrong, in one sentence naming the file, for errors their input causes: vkv's own, the
    operating system's (a path that is missing, a directory, not writable, a full disk), and unreadable JSON or
    safetensors data that reached a reader without its own check. None for anything else (a bug)."""
    if isinstance(exc, VkvError):
        return str(exc)
    if isinstance(exc, OSError):
        where = exc.filename or "a file"
        return f"{where}: {exc.strerror or exc.__class__.__name__}".replace("\n", " ")
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
    if type(exc).__name__ == "SafetensorError":
        return f"not a readable safetensors file: {str(exc).splitlines()[0] if str(exc) else 'corrupt'}"
    return None


__all__ = ["build_parser", "recipe_from_args", "main"]

if __name__ == "__main__":
    sys.exit(main())
