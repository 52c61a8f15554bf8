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


def add_compress_args(p: argparse.ArgumentParser) -> None:
    from .optimize import INITS, LOSSES, SCHEDULES, OptimConfig
    from .pooling import POOLING_RULES
    from .positions import POSITION_SCHEMES
    from .targets import TARGET_KINDS

    d = OptimConfig()
    p.add_argument("--ratio", type=float, default=3.2, help="span tokens per virtual token (≥ 1)")
    p.add_argument("--span", help="turns:A-B (inclusive message indices); default: all after the system message")
    p.add_argument("--pooling", default="surprisal", choices=sorted(POOLING_RULES))
    p.add_argument("--positions", default="interpolate", choices=sorted(POSITION_SCHEMES))
    p.add_argument("--target", default="v", choices=TARGET_KINDS)
    p.add_argument("--boundaries", default="equal", choices=("equal", "lines"))
    p.add_argument("--init", default=d.init, choices=INITS)
    p.add_argument("--loss", default=d.loss, choices=LOSSES)
    p.add_argument("--schedule", default=d.schedule, choices=SCHEDULES)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--patience", type=int, default=d.patience)
    p.add_argument("--seed", type=int, default=d.seed)


def compress_config_from_args(args: argparse.Namespace):
    from .compress import CompressConfig
    from .optimize import OptimConfig

    optim = OptimConfig(steps=args.steps, lr=args.lr, init=args.init, loss=args.loss, schedule=args.schedule,
                        patience=args.patience, seed=args.seed).validate()
    return CompressConfig(ratio=args.ratio, pooling=args.pooling, positions=args.positions, target=args.target,
                          boundaries=args.boundaries, optim=optim)


@command("compress")
def cmd_compress(args: argparse.Namespace) -> int:
    import torch

    from .cache import save_cache
    from .compress import compress_transcript
    from .progress import step_bar
    from .transcript import load_transcript, parse_turn_span

    transcript = load_transcript(args.transcript)
    turns = parse_turn_span(args.span, transcript)
    config = compress_config_from_args(args)
    if config.pooling == "attention":
        raise VkvError("--pooling attention needs a question and is only available through `vkv eval`")
    torch.manual_seed(config.optim.seed)
    lm = load_from_args(args)
    with step_bar(f"compressing turns {turns[0]}-{turns[1] - 1}", config.optim.steps, console) as on_step:
        spliced = compress_transcript(lm, transcript, turns, config, on_step=on_step)
    save_cache(spliced, args.out)
    virtual = [s for s in spliced.segments if s.kind == "virtual"][0]
    summary = {
        "span_tokens": virtual.original_tokens, "virtual_tokens": virtual.entries,
        "ratio_achieved": round(virtual.ratio, 4), "initial_loss": virtual.stats["initial_loss"],
        "final_loss": virtual.stats["best_loss"], "steps": virtual.stats["steps"],
        "stopped": virtual.stats["stopped"], "seconds": round(virtual.stats["seconds"], 2),
        "seconds_per_step": round(virtual.stats["seconds_per_step"], 4), "cache": args.out,
    }
    console.print(key_value_table("vkv compress", summary))
    write_json(args.json, {**summary, "config": config.to_dict(), "segments": spliced.table(),
                           "per_layer_loss": virtual.stats["per_layer_loss"]})
    return 0


@command("inspect")
def cmd_inspect(args: argparse.Namespace) -> int:
    from .cache import read_header

    header = read_header(args.cache)
    meta = {k: v for k, v in header.items() if k not in ("segments", "config", "spec", "transcript")}
    meta.update({f"transcript.{k}": v for k, v in header.get("transcript", {}).items()})
    console.print(key_value_table(f"{args.cache}", meta))
    table = Table(title="segments")
    for col in ("#", "kind", "span", "tokens", "entries", "ratio", "loss init→best", "steps"):
        table.add_column(col)
    for i, seg in enumerate(header["segments"]):
        st = seg.get("stats", {})
        loss = f"{st['initial_loss']:.4f}→{st['best_loss']:.4f}" if "best_loss" in st else "—"
        span = seg["span"]
        table.add_row(str(i), seg["kind"], f"{span[0]}–{span[1]}", str(span[1] - span[0]), str(seg["entries"]),
                      f"{seg['ratio']:.2f}", loss, str(st.get("steps", "—")))
    console.print(table)
    if args.json:
        write_json(args.json, header)
    return 0


@command("ask")
def cmd_ask(args: argparse.Namespace) -> int:
    from .cache import load_cache, read_header
    from .decode import Context
    from .transcript import followup, load_transcript, render

    header = read_header(args.cache)
    if args.model is None:
        args.model = header.get("model")
    lm = load_from_args(args)
    spliced = load_cache(args.cache, lm)
    transcript_path = args.transcript or header.get("transcript", {}).get("path")
    if not transcript_path:
        raise VkvError(f"{args.cache}: no transcript path recorded; pass --transcript")
    transcript = load_transcript(transcript_path)
    if header.get("transcript", {}).get("sha256") not in (None, transcript.sha256):
        raise VkvError(f"{transcript_path}: field sha256: this transcript is not the one the cache was built from")
    rendered = render(transcript, lm.tokenizer)
    prompt, _ = followup(lm.tokenizer, rendered, transcript, args.question, args.answer_prefix or "")
    answer = lm.tokenizer.decode(Context(lm, spliced).greedy(prompt, args.max_new_tokens), skip_special_tokens=True)
    console.print(f"[bold]Q:[/] {args.question}")
    console.print(f"[bold]A:[/] {(args.answer_prefix or '')}{answer}")
    write_json(args.json, {"question": args.question, "answer": answer, "cache": args.cache})
    return 0


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

    p = sub.add_parser("compress", help="compress a transcript span into virtual tokens; save a cache file")
    p.add_argument("transcript")
    add_model_args(p)
    add_compress_args(p)
    p.add_argument("--out", required=True, help="cache file to write (.safetensors)")
    p.add_argument("--json", help="also write the summary, config and per-layer loss here")

    p = sub.add_parser("inspect", help="print a cache file's metadata and segment table")
    p.add_argument("cache")
    p.add_argument("--json", help="also write the header here")

    p = sub.add_parser("ask", help="answer a question from a compressed cache")
    p.add_argument("cache")
    add_model_args(p)
    p.set_defaults(model=None)
    p.add_argument("--question", required=True)
    p.add_argument("--answer-prefix", default="", help="text the answer starts with")
    p.add_argument("--transcript", help="the transcript the cache was built from (default: recorded path)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json")

    for extension in _EXTENSIONS:
        extension(sub)
    return parser


_EXTENSIONS: list[Callable] = []


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "model", "unset") is None and args.command != "ask":
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
