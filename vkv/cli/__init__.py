"""The `vkv` command line: one module per command, each adding its parser with `register(sub)`; rich tables for
people, `--json FILE` for machines, one-sentence errors.

Every flag is a field of a config dataclass (vkv.settings: `add_arguments` makes the flags, `from_args` builds the
config back); only positional arguments (files) are hand-written. This package is the only code that sees an
`argparse.Namespace`: a command's `cmd_*` function builds its config and hands it, with plain values, to the library.
Building the parser reads every config and method registry, which imports torch and transformers, so `main` uses the
parser's cached description (vkv.cli.cached) and imports a command's module only when the command runs: `vkv --help`,
`vkv eval --help` and argument errors take a fraction of a second. Command modules import what they use at the top;
this module and vkv.cli.cached import nothing heavy."""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import import_module

from rich.markup import escape

from vkv.cli.cached import cached_parser
from vkv.cli.consoles import errors
from vkv.errors import VkvError, too_long_remedy
from vkv.home import check_home
from vkv.io import check_output, forcing
from vkv.upgrade import old_flag

COMMAND_MODULES = (
    "models",
    "tools",
    "render",
    "importer",
    "compress",
    "inspect",
    "ask",
    "chat",
    "eval",
    "score",
    "validate",
    "sweep",
    "prune",
)
TOKENIZER_ONLY = ("render",)  # these load the default model's tokenizer, not its weights, when --model is not given


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vkv",
        description="Compress a coding agent's conversation at the model's representation layer; compare it with "
        "text-level and KV-cache methods on the same factual-recall eval.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        import_module(f"vkv.cli.{name}").register(sub)
    from vkv.cli.common import OutputFlags
    from vkv.settings import add_arguments

    for command in sub.choices.values():  # every command that writes files may be told to replace a foreign one
        if command.get_default("outputs") or command.get_default("output_dirs"):
            add_arguments(command, OutputFlags)
    return parser


def main(argv: list[str] | None = None) -> int:
    renamed = old_flag(sys.argv[1:] if argv is None else argv)  # before argparse, which would only call it unknown
    if renamed:
        errors.print(f"[bold red]error:[/] {escape(renamed)}", highlight=False, soft_wrap=True)
        return 2
    try:
        args = cached_parser(build_parser).parse_args(argv)
    except SystemExit as exit_:  # --help, or argparse refusing a flag in one line: its exit code is returned
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        check_inputs(args)
        check_home()
        if getattr(args, "model", "unset") is None and args.command in TOKENIZER_ONLY:
            from vkv.lm.load import DEFAULT_MODEL

            args.model = DEFAULT_MODEL  # others load vkv's default model where it can run (vkv.cli.common)
        if isinstance(getattr(args, "model", None), str):  # a misspelled alias fails now, not after loading anything
            from vkv.lm.load import resolve_model_path

            resolve_model_path(args.model)
        check_outputs(args)
        with forcing(bool(getattr(args, "force", False))), too_long_remedy(too_long_hint(args)):
            return args.run(args) or 0
    except KeyboardInterrupt:
        errors.print("[yellow]interrupted[/]")
        return 130
    except Exception as exc:
        message = one_sentence(exc)
        if message is None or os.environ.get("VKV_DEBUG") == "1":
            raise  # a bug: its traceback is what a report needs
        errors.print(
            f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True
        )  # one line, unwrapped  # a path or [[grid]] is not markup
        return 2


TOO_LONG_HINTS = {  # commands without --window: what shortens the text they give the model
    "ask": "ask a shorter question, or ask a cache of fewer messages",
    "chat": "start the chat from fewer messages",
    "sweep": "give the experiment a smaller window (its window setting)",
}


def too_long_hint(args: argparse.Namespace) -> str:
    """How a refusal of a text beyond the model's positions ends for this command: --window where the command has
    the flag and it was not given, a smaller --window where it was (the window itself is too long), else what the
    command does offer."""
    if not hasattr(args, "window"):
        return TOO_LONG_HINTS.get(args.command, "pass a shorter conversation")
    if args.window is None:
        return "use a window of it (--window)"
    return f"the window itself is too long for this model: give a --window below {args.window}"


INPUTS = {  # arguments naming files the command reads, and what a sentence calls them
    "transcript": "the transcript",
    "transcripts": "the transcript",
    "file": "the input file",
    "source": "the chat's source",
    "cache": "the cache",
    "config": "the experiment file",
    "checkpoint": "the checkpoint",
}
OUTPUT_KINDS = {  # (command, output) → the kind of file it writes (vkv.io.FILE_KINDS); the others write JSON
    ("compress", "out"): "cache",
    ("import", "out"): "transcript",
}


def check_inputs(args: argparse.Namespace) -> None:
    """Refuse an input file (INPUTS) that is not there before anything heavy is imported: a misspelled path is one
    sentence at once, not after torch and the model have loaded."""
    for name, label in INPUTS.items():
        value = getattr(args, name, None)
        for given in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(given, str) and given and not os.path.lexists(given):
                raise VkvError(f"{given}: no such file ({label})")


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, an output file (the command's `outputs`) that vkv.io.check_output refuses: one that
    cannot be written, is not a regular file, is one of its inputs (positional files, --transcript, the model's
    directory, the transcript a cache file records) or another of its outputs, is kept by vkv, or would replace a file
    of another kind without --force; and where an output is a cache, a signing key that could not sign it. A sweep's
    results directory is not an input: its files are appended to."""
    outputs = {
        name: getattr(args, name) for name in getattr(args, "outputs", ()) if getattr(args, name, None) is not None
    }
    if not outputs:
        return
    inputs: dict[str, str] = {}
    for name, label in INPUTS.items():
        value = getattr(args, name, None)
        for given in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(given, str) and given:
                inputs.setdefault(given, label)
    model = getattr(args, "model", None)
    if isinstance(model, str):
        from vkv.lm.load import model_directory

        directory = model_directory(model)
        if directory:  # every file in it is read: weights, tokenizer, config
            inputs.setdefault(directory, "the model directory")
    inputs.update({k: v for k, v in recorded_transcript(args).items() if k not in inputs})
    flags = {name: "--" + name.replace("_", "-") for name in outputs}
    kinds = {name: OUTPUT_KINDS.get((args.command, name), "json") for name in outputs}
    force = bool(getattr(args, "force", False))
    for forced in (True, force):  # where each output may go at all first; then what it would replace without --force
        for name, target in outputs.items():
            others = {flags[other]: path for other, path in outputs.items() if other != name}
            check_output(target, flags[name], kinds[name], forced, inputs, others)
    if "cache" in kinds.values():
        from vkv.kv.sign import check_key

        check_key()


def recorded_transcript(args: argparse.Namespace) -> dict[str, str]:
    """The transcript path the command's cache file records (`vkv ask` reads it; it is the text the cache stands
    for), as an input; nothing when the file cannot be read, which the command then refuses in its own sentence."""
    cache = getattr(args, "cache", None)
    if not isinstance(cache, str) or not cache:
        return {}
    from vkv.kv.file import read_header  # imports torch: only for a command that runs on a cache file

    try:
        record = read_header(cache).get("transcript") or {}
    except (VkvError, OSError):
        return {}
    path = record.get("path")
    return {path: "the transcript the cache records"} if isinstance(path, str) and path else {}


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


def __getattr__(name: str):
    if name == "recipe_from_args":  # imported on first use: it needs the recipe's configs, and so torch
        from vkv.cli.method_flags import recipe_from_args

        return recipe_from_args
    raise AttributeError(f"module 'vkv.cli' has no attribute {name!r}")


__all__ = ["build_parser", "recipe_from_args", "main"]

if __name__ == "__main__":
    sys.exit(main())
