"""The `vkv` command line: rich tables for people, `--json FILE` for machines, one-sentence errors."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from rich.console import Console
from rich.table import Table

from .errors import VkvError

console = Console()
COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {}


def command(name: str):
    def register(fn):
        COMMANDS[name] = fn
        return fn

    return register


def add_model_args(p: argparse.ArgumentParser) -> None:
    from .model import DEFAULT_MODEL, QUANTS

    p.add_argument("--model", default=DEFAULT_MODEL, help="hub id, local directory, or alias (smollm2-135m)")
    p.add_argument("--quant", default="auto", choices=QUANTS, help="auto = 8bit on CUDA, fp32 on CPU")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"), help="attention implementation")


def load_from_args(args: argparse.Namespace):
    from .model import load_model

    with console.status(f"loading {args.model} ({args.quant})"):
        return load_model(args.model, quant=args.quant, device=args.device, attn_implementation=args.attn)


def write_json(path: str | None, obj) -> None:
    if path:
        from .io import write_json_atomic

        write_json_atomic(path, obj)
        console.print(f"wrote {path}")


def key_value_table(title: str, rows: dict) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for k, v in rows.items():
        table.add_row(str(k), f"{v:.4g}" if isinstance(v, float) else str(v))
    return table


# ---- commands -----------------------------------------------------------------------------------


@command("models")
def cmd_models(args: argparse.Namespace) -> int:
    from . import zoo

    if args.models_command == "fetch":
        zoo.fetch(args.name, force=args.force, log=console.print)
        return 0
    table = Table(title="models vkv can fetch")
    for col in ("alias", "fetched", "path", "description"):
        table.add_column(col)
    for alias, source in zoo.ZOO.items():
        table.add_row(alias, "yes" if zoo.is_fetched(alias) else "no", str(zoo.model_path(alias)), source.description)
    console.print(table)
    return 0


@command("doctor")
def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import check

    lm = load_from_args(args)
    report = check(lm)
    console.print(key_value_table("vkv doctor", report))
    write_json(args.json, report)
    if not report["ok"]:
        console.print("[red]doctor: gradients did not reach the input embeddings, or model weights are trainable[/]")
        return 1
    return 0


@command("render")
def cmd_render(args: argparse.Namespace) -> int:
    from .transcript import load_transcript, render

    transcript = load_transcript(args.transcript)
    lm_tokenizer = _tokenizer_for(args.model)
    rendered = render(transcript, lm_tokenizer)
    table = Table(title=f"{transcript.id}: {len(rendered.ids)} tokens, {len(rendered.spans)} messages")
    for col, justify in (("turn", "right"), ("role", "left"), ("start", "right"), ("end", "right"),
                         ("tokens", "right"), ("first words", "left")):
        table.add_column(col, justify=justify)
    for span, message in zip(rendered.spans, transcript.messages):
        words = " ".join(message.content.split())[:60]
        table.add_row(str(span.turn), span.role, str(span.start), str(span.end), str(span.length), words)
    console.print(table)
    tiles = rendered.spans[0].start == 0 and rendered.spans[-1].end == len(rendered.ids) and all(
        a.end == b.start for a, b in zip(rendered.spans, rendered.spans[1:])
    )
    notes = []
    if rendered.inlined_tool_calls:
        notes.append("the chat template drops tool_calls, so they are rendered into the message text")
    if rendered.tool_role_as != "tool":
        notes.append(f"the chat template has no tool role, so tool messages render as {rendered.tool_role_as}")
    for n in notes:
        console.print(f"note: {n}")
    console.print(f"spans tile the {len(rendered.ids)} ids: {'yes' if tiles else 'NO'}")
    write_json(args.json, {"transcript": transcript.id, "tokens": len(rendered.ids),
                           "spans": [vars(s) for s in rendered.spans]})
    return 0 if tiles else 1


def _tokenizer_for(name: str):
    from transformers import AutoTokenizer

    from .model import resolve_model_path

    path, local = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=local)
    except OSError as exc:
        raise VkvError(f"could not load the tokenizer of '{name}': {str(exc).splitlines()[0]}") from exc


# ---- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vkv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("models", help="list or fetch models vkv knows by alias")
    msub = p.add_subparsers(dest="models_command")
    f = msub.add_parser("fetch", help="download and convert a model into $VKV_HOME/models")
    f.add_argument("name")
    f.add_argument("--force", action="store_true", help="fetch again even if present")
    msub.add_parser("list", help="list aliases")

    p = sub.add_parser("doctor", help="load a model and check gradients flow to the input embeddings")
    add_model_args(p)
    p.add_argument("--json", help="also write the report to this file")

    p = sub.add_parser("render", help="render a transcript and print its per-message token spans")
    p.add_argument("transcript")
    p.add_argument("--model", default=None, help="model whose tokenizer and chat template to use")
    p.add_argument("--json", help="also write the span table to this file")

    for extension in _EXTENSIONS:
        extension(sub)
    return parser


_EXTENSIONS: list[Callable] = []


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "model", "unset") is None:
        from .model import DEFAULT_MODEL

        args.model = DEFAULT_MODEL
    try:
        return COMMANDS[args.command](args) or 0
    except VkvError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
