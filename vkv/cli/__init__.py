"""The `vkv` command line: rich tables for people, `--json FILE` for machines, one-sentence errors."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from vkv.errors import VkvError
from vkv.settings import add_arguments, from_args

# Piped output (logs, CI) gets wide tables instead of rich's 80-column default.
console = Console() if sys.stdout.isatty() else Console(width=160)
errors = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)  # keeps stdout parseable
COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {}


def command(name: str):
    def register(fn):
        COMMANDS[name] = fn
        return fn

    return register


def add_model_args(p: argparse.ArgumentParser) -> None:
    from vkv.lm.load import DEFAULT_MODEL, QUANTS

    p.add_argument("--model", default=DEFAULT_MODEL, help="hub id, local directory, or alias (smollm2-135m)")
    p.add_argument("--quant", default="auto", choices=QUANTS, help="auto = 8bit on CUDA, fp32 on CPU")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"), help="attention implementation")


def load_from_args(args: argparse.Namespace):
    from vkv.lm.load import load_model

    with console.status(f"loading {args.model} ({args.quant})"):
        return load_model(args.model, quant=args.quant, device=args.device, attn_implementation=args.attn)


def write_json(path: str | None, obj) -> None:
    if path:
        from vkv.io import write_json_atomic

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
    from vkv.lm import zoo

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
    from vkv.tools.doctor import check

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
    from vkv.text.transcript import load_transcript, render

    transcript = load_transcript(args.transcript)
    lm_tokenizer = _tokenizer_for(args.model)
    rendered = render(transcript, lm_tokenizer)
    table = Table(title=f"{transcript.id}: {len(rendered.ids)} tokens, {len(rendered.spans)} messages")
    for col, justify in (
        ("turn", "right"),
        ("role", "left"),
        ("start", "right"),
        ("end", "right"),
        ("tokens", "right"),
        ("first words", "left"),
    ):
        table.add_column(col, justify=justify)
    for span, message in zip(rendered.spans, transcript.messages):
        words = " ".join(message.content.split())[:60]
        table.add_row(str(span.turn), span.role, str(span.start), str(span.end), str(span.length), words)
    console.print(table)
    tiles = (
        rendered.spans[0].start == 0
        and rendered.spans[-1].end == len(rendered.ids)
        and all(a.end == b.start for a, b in zip(rendered.spans, rendered.spans[1:]))
    )
    notes = []
    if rendered.inlined_tool_calls:
        notes.append("the chat template drops tool_calls, so they are rendered into the message text")
    if rendered.tool_role_as != "tool":
        notes.append(f"the chat template has no tool role, so tool messages render as {rendered.tool_role_as}")
    for n in notes:
        console.print(f"note: {n}")
    console.print(f"spans tile the {len(rendered.ids)} ids: {'yes' if tiles else 'NO'}")
    write_json(
        args.json,
        {"transcript": transcript.id, "tokens": len(rendered.ids), "spans": [vars(s) for s in rendered.spans]},
    )
    return 0 if tiles else 1


def _tokenizer_for(name: str):
    from transformers import AutoTokenizer

    from vkv.lm.load import resolve_model_path

    path, local = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=local)
    except OSError as exc:
        raise VkvError(f"could not load the tokenizer of '{name}': {str(exc).splitlines()[0]}") from exc


def add_compress_args(p: argparse.ArgumentParser, several_ratios: bool = False) -> None:
    """The span and ratio flags, then one flag per CompressConfig setting (vkv.settings)."""
    from vkv.compress.config import CompressConfig
    from vkv.settings import add_arguments

    ratio = CompressConfig().ratio
    if several_ratios:
        p.add_argument("--ratio", default=str(ratio), help="comma-separated compression ratios (span tokens per entry)")
    else:
        p.add_argument("--ratio", type=float, default=ratio, help="span tokens per virtual token (≥ 1)")
    p.add_argument("--span", help="turns:A-B (inclusive message indices); default: all after the system message")
    add_arguments(p.add_argument_group("compression (vkv's recipe)"), CompressConfig)


def compress_config_from_args(args: argparse.Namespace):
    from vkv.compress.config import CompressConfig
    from vkv.settings import from_args

    config = from_args(CompressConfig, args)
    if isinstance(args.ratio, float):  # eval sets the ratio per run
        config.ratio = args.ratio
    return config.validate()


@command("compress")
def cmd_compress(args: argparse.Namespace) -> int:
    import torch

    from vkv.cli.multiturn import wants_multiturn
    from vkv.compress.single import compress_transcript
    from vkv.kv.file import save_cache
    from vkv.progress import step_bar
    from vkv.text.transcript import load_transcript, parse_turn_span

    transcript = load_transcript(args.transcript)
    config = compress_config_from_args(args)
    if config.pooling == "attention":
        raise VkvError("--pooling attention needs a question and is only available through `vkv eval`")
    torch.manual_seed(config.optim.seed)
    lm = load_from_args(args)
    window = None
    if args.window:
        transcript, window = _pick_window(lm, transcript, args.window, args.window_index)
    turns = parse_turn_span(args.span, transcript)
    if wants_multiturn(args):
        return _compress_multiturn(args, lm, transcript, turns, config, window)
    with step_bar(
        f"compressing {transcript.id} turns {turns[0]}-{turns[1] - 1}", config.optim.steps, console
    ) as on_step:
        spliced = compress_transcript(lm, transcript, turns, config, on_step=on_step, window=window)
    save_cache(spliced, args.out)
    virtual = [s for s in spliced.segments if s.kind == "virtual"][0]
    summary = {
        "span_tokens": virtual.original_tokens,
        "virtual_tokens": virtual.entries,
        "ratio_achieved": round(virtual.ratio, 4),
        "initial_loss": virtual.stats["initial_loss"],
        "final_loss": virtual.stats["best_loss"],
        "steps": virtual.stats["steps"],
        "stopped": virtual.stats["stopped"],
        "seconds": round(virtual.stats["seconds"], 2),
        "seconds_per_step": round(virtual.stats["seconds_per_step"], 4),
        "cache": args.out,
    }
    console.print(key_value_table("vkv compress", summary))
    write_json(
        args.json,
        {
            **summary,
            "config": config.to_dict(),
            "segments": spliced.table(),
            "per_layer_loss": virtual.stats["per_layer_loss"],
        },
    )
    return 0


def _compress_multiturn(args, lm, transcript, turns, config, window) -> int:
    from vkv.cli.multiturn import compress_multiturn
    from vkv.kv.file import read_header, save_cache
    from vkv.kv.report import report_rows, report_table

    with console.status(f"compressing {transcript.id} turns {turns[0]}-{turns[1] - 1} turn by turn"):
        spliced = compress_multiturn(lm, transcript, turns, config, args, window=window)
    save_cache(spliced, args.out)
    rows = report_rows(read_header(args.out))
    console.print(report_table(rows))
    write_json(args.json, {"config": config.to_dict(), "segments": spliced.table(), "report": rows})
    return 0


def _pick_window(lm, transcript, max_tokens: int, index: int):
    """The index-th window (most questions first) of a transcript, and its original turn range."""
    from vkv.text.transcript import render
    from vkv.text.windows import select_windows

    windows = select_windows(transcript, render(transcript, lm.tokenizer), max_tokens)
    if not 0 <= index < len(windows):
        raise VkvError(f"--window-index {index}: {transcript.path} has {len(windows)} windows with questions")
    chosen = windows[index]
    first, last = (int(x) for x in chosen.id.rsplit("@turns", 1)[1].split("-"))
    return chosen, (first, last + 1)


@command("inspect")
def cmd_inspect(args: argparse.Namespace) -> int:
    from vkv.kv.file import read_header

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
        table.add_row(
            str(i),
            seg["kind"],
            f"{span[0]}–{span[1]}",
            str(span[1] - span[0]),
            str(seg["entries"]),
            f"{seg['ratio']:.2f}",
            loss,
            str(st.get("steps", "—")),
        )
    console.print(table)
    if any(seg.get("stats", {}).get("turn") is not None for seg in header["segments"]) or args.report:
        from vkv.kv.report import report_rows, report_table

        console.print(report_table(report_rows(header)))
    if args.json:
        write_json(args.json, header)
    return 0


@command("ask")
def cmd_ask(args: argparse.Namespace) -> int:
    from vkv.kv.context import Context
    from vkv.kv.file import load_cache, read_header
    from vkv.text.transcript import followup, load_transcript, render

    header = read_header(args.cache)
    if args.model is None:
        args.model = header.get("model")
    lm = load_from_args(args)
    spliced = load_cache(args.cache, lm)
    transcript_path = args.transcript or header.get("transcript", {}).get("path")
    if not transcript_path:
        raise VkvError(f"{args.cache}: no transcript path recorded; pass --transcript")
    transcript = load_transcript(transcript_path)
    recorded = header.get("transcript", {})
    if recorded.get("sha256") not in (None, transcript.sha256):
        raise VkvError(f"{transcript_path}: field sha256: this transcript is not the one the cache was built from")
    if recorded.get("window"):
        from vkv.text.windows import window_transcript

        transcript = window_transcript(transcript, *recorded["window"])
    rendered = render(transcript, lm.tokenizer)
    prompt, _ = followup(lm.tokenizer, rendered, transcript, args.question, args.answer_prefix or "")
    answer = lm.tokenizer.decode(Context(lm, spliced).greedy(prompt, args.max_new_tokens), skip_special_tokens=True)
    console.print(f"[bold]Q:[/] {args.question}")
    console.print(f"[bold]A:[/] {(args.answer_prefix or '')}{answer}")
    write_json(args.json, {"question": args.question, "answer": answer, "cache": args.cache})
    return 0


def _eval_units(
    lm, paths: list[str], span: str | None, window: int | None, max_windows: int | None, span_only: bool = False
):
    """(transcript, turns) for each evaluation unit: whole transcripts, a span, the span alone, or windows."""
    from vkv.text.transcript import load_transcript, parse_turn_span, render
    from vkv.text.windows import select_windows, window_transcript

    for path in paths:
        transcript = load_transcript(path)
        if span_only:
            if not span:
                raise VkvError("--span-only needs --span turns:A-B")
            yield window_transcript(transcript, *parse_turn_span(span, transcript)), None
        elif window:
            rendered = render(transcript, lm.tokenizer)
            for sub in select_windows(transcript, rendered, window, max_windows):
                yield sub, None
        else:
            yield transcript, parse_turn_span(span, transcript)


def _parse_list(text: str, cast, what: str) -> list:
    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise VkvError(f"--{what} {text!r}: expected a comma-separated list") from None


@command("eval")
def cmd_eval(args: argparse.Namespace) -> int:
    from vkv.cli.multiturn import method_options
    from vkv.evals.runner import EvalSettings, TranscriptEval
    from vkv.evals.summary import aggregate
    from vkv.kv.file import load_cache
    from vkv.methods import METHODS, get_method
    from vkv.progress import step_bar

    methods = _parse_list(args.method, str, "method")
    for name in methods:
        if name not in METHODS:
            raise VkvError(f"--method: unknown method '{name}'; choose from {', '.join(METHODS)}")
        if args.per_turn and METHODS[name].uses_ratio and "per_turn" not in METHODS[name].option_names():
            per_turn = ", ".join(n for n, c in METHODS.items() if "per_turn" in c.option_names())
            raise VkvError(
                f"--per-turn: method '{name}' has no per-turn mode (methods with one: {per_turn}; vkv's "
                "is the method sequential)"
            )
    ratios = _parse_list(args.ratio, float, "ratio")
    compress_config = compress_config_from_args(args)
    settings = dataclasses.replace(from_args(EvalSettings, args), seed=args.seed)
    lm = load_from_args(args)
    results = []
    for transcript, turns in _eval_units(
        lm, args.transcripts, args.span, args.window, args.max_windows, args.span_only
    ):
        with console.status(f"{transcript.id}: full and none references"):
            evaluation = TranscriptEval(lm, transcript, turns, settings)
        if args.cache:
            results.append(evaluation.evaluate_cache(load_cache(args.cache, lm)))
        for name in methods:
            method = get_method(
                name,
                recipe=compress_config,
                query_aware=args.query_aware,
                checkpoint=args.checkpoint,
                **method_options(args),
                **({"per_turn": True} if args.per_turn else {}),
            )
            for ratio in ratios if method.uses_ratio else [None]:
                label = f"{transcript.id} {name}" + (f" @ {ratio}×" if ratio else "")
                if method.reports_steps:
                    with step_bar(label, compress_config.optim.steps, console) as on_step:
                        results.append(evaluation.evaluate(method, ratio, on_step))
                else:
                    with console.status(label):
                        results.append(evaluation.evaluate(method, ratio))
        write_json(args.json, results) if args.json else None
    _print_eval(results, aggregate(results))
    return 0


def _print_eval(results: list[dict], rows: list[dict]) -> None:
    table = Table(title="factual-recall evaluation (pooled over windows and questions)")
    for col in (
        "transcript",
        "method",
        "ratio",
        "achieved",
        "questions",
        "keyword acc",
        "choice acc",
        "retention",
        "fidelity KL",
        "seconds",
    ):
        table.add_column(col, justify="left" if col in ("transcript", "method") else "right")
    fmt = lambda v, p=3: "—" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in rows:
        table.add_row(
            r["transcript"],
            r["method"],
            fmt(r["ratio_requested"], 1),
            fmt(r["ratio_achieved"], 2),
            f"{r['questions']} ({r['weak']} weak)",
            fmt(r["keyword_accuracy"], 2),
            fmt(r["choice_accuracy"], 2),
            fmt(r["mean_retention"]),
            fmt(r["fidelity_kl"]),
            fmt(r["seconds"], 1),
        )
    console.print(table)
    per_q = Table(title="retention per question (weak questions in brackets)")
    per_q.add_column("window / question")
    columns = [(r["method"], r["ratio_requested"]) for r in results if r["transcript"] == results[0]["transcript"]]
    for method, ratio in columns:
        per_q.add_column(f"{method}" + (f" {ratio}×" if ratio else ""), justify="right")
    by_unit: dict[str, dict] = {}
    for r in results:
        by_unit.setdefault(r["transcript"], {})[(r["method"], r["ratio_requested"])] = r
    for unit, res in by_unit.items():
        first = next(iter(res.values()))
        for qi, q in enumerate(first["questions"]):
            cells = []
            for key in columns:
                qq = res[key]["questions"][qi] if key in res else None
                value = "—" if qq is None or qq["retention"] is None else f"{qq['retention']:.2f}"
                cells.append(f"({value})" if qq and qq["weak"] else value)
            per_q.add_row(f"{unit} / {q['id']}", *cells)
    console.print(per_q)


@command("validate")
def cmd_validate(args: argparse.Namespace) -> int:
    from vkv.evals.validate import check_static
    from vkv.text.transcript import load_transcript

    problems, warnings, checked = [], [], []
    for path in args.transcripts:
        try:
            transcript = load_transcript(path)
        except VkvError as exc:
            problems.append(str(exc))
            continue
        found = check_static(transcript)
        problems += found.problems
        warnings += found.warnings
        checked.append(transcript)
    if args.model and checked:
        warnings += _validate_with_model(args, checked)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
    for p in problems:
        console.print(f"[bold red]problem:[/] {p}", highlight=False)
    console.print(f"{len(args.transcripts)} transcript(s): {len(problems)} problem(s), {len(warnings)} warning(s)")
    return 1 if problems else 0


def _validate_with_model(args: argparse.Namespace, transcripts) -> list[str]:
    from vkv.evals.runner import EvalSettings, TranscriptEval

    lm = load_from_args(args)
    warnings = []
    counts: dict[str, list[int]] = {}  # split → [questions, usable]
    table = Table(title="no-context default and context gap per question")
    for col in ("window", "question", "no-context pick", "full-context pick", "gap (nats)"):
        table.add_column(col)
    for transcript in transcripts:
        for unit, turns in _eval_units(lm, [transcript.path], None, args.window, None):
            with console.status(f"{unit.id}: full and none references"):
                ev = TranscriptEval(lm, unit, turns, EvalSettings(min_gap=args.min_gap))
            for pq, full, none in zip(ev.questions, ev.full, ev.none):
                q = pq.question
                options = list(q.choices) or list(q.accept[:1])
                none_pick, full_pick = (
                    options[max(range(len(options)), key=m.choice_logprobs.__getitem__)] for m in (none, full)
                )
                gap = full.choice_logprobs[0] - none.choice_logprobs[0]
                table.add_row(unit.id, q.id, none_pick, full_pick, f"{gap:.2f}")
                tally = counts.setdefault(transcript.split or "unsplit", [0, 0])
                tally[0] += 1
                tally[1] += gap >= args.min_gap
                if len(options) > 1 and none_pick == options[0]:
                    warnings.append(f"{unit.id}: {q.id}: the model already picks the right answer with no context")
                if gap < args.min_gap:
                    warnings.append(f"{unit.id}: {q.id}: full-vs-none gap {gap:.2f} nats is below {args.min_gap}")
    console.print(table)
    for split, (questions, usable) in sorted(counts.items()):
        console.print(
            f"split {split}: {usable} of {questions} questions usable (full-vs-none gap ≥ {args.min_gap} "
            f"nats in {args.window}-token windows)"
        )
    return warnings


@command("sweep")
def cmd_sweep(args: argparse.Namespace) -> int:
    from vkv.sweep import run_sweep

    return run_sweep(args)


@command("report")
def cmd_report(args: argparse.Namespace) -> int:
    from vkv.sweep.report import run_report

    return run_report(args)


@command("prune")
def cmd_prune(args: argparse.Namespace) -> int:
    if args.backend == "longcodezip":
        from vkv.backends.longcodezip.cli import run_prune

        if (args.ratio is None) == (args.budget is None):
            raise VkvError("give exactly one of --ratio or --budget")
    else:
        from vkv.backends.lamr.cli import run_prune

        if args.ratio is not None and args.budget is not None:
            raise VkvError("give at most one of --ratio or --budget (neither: keep lines scoring ≥ --threshold)")
    with console.status(f"pruning {args.file} with {args.backend}"):
        payload = run_prune(args)
    console.print(payload["text"], markup=False, highlight=False)
    console.print(
        f"[dim]{payload['original_tokens']} → {payload['compressed_tokens']} tokens "
        f"(ratio {payload['ratio_achieved']:.2f}), {len(payload['kept_lines'])} lines kept[/]"
    )
    return 0


@command("lamr")
def cmd_lamr(args: argparse.Namespace) -> int:
    from vkv.backends.lamr.cli import run_lamr

    return run_lamr(args, console)


@command("bench")
def cmd_bench(args: argparse.Namespace) -> int:
    from vkv.tools.bench import run_bench

    return run_bench(args)


@command("plan")
def cmd_plan(args: argparse.Namespace) -> int:
    from vkv.tools.memory import run_plan

    return run_plan(args)


# ---- parser -------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from vkv.cli.multiturn import add_multiturn_args
    from vkv.evals.runner import EvalSettings

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
    p.add_argument("--window", type=int, help="compress one turn window of at most this many tokens")
    p.add_argument("--window-index", type=int, default=0, help="which window (0 = the one with most questions)")
    p.add_argument("--out", required=True, help="cache file to write (.safetensors)")
    p.add_argument("--json", help="also write the summary, config and per-layer loss here")

    add_multiturn_args(p)

    p = sub.add_parser("inspect", help="print a cache file's metadata and segment table")
    p.add_argument("cache")
    p.add_argument("--report", action="store_true", help="also print the per-turn compression report")
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

    p = sub.add_parser("eval", help="score methods on transcripts with the factual-recall questions")
    p.add_argument("transcripts", nargs="+")
    add_model_args(p)
    p.add_argument("--method", default="full,none,truncate,vkv", help="comma-separated methods")
    add_compress_args(p, several_ratios=True)
    p.add_argument("--window", type=int, help="cut transcripts into turn windows of at most this many tokens")
    p.add_argument("--max-windows", type=int, help="evaluate only the windows with the most questions")
    p.add_argument(
        "--span-only",
        action="store_true",
        help="evaluate the --span turns as their own window: system message + those turns, later turns "
        "dropped, questions first answered there",
    )
    add_multiturn_args(p)
    p.add_argument("--checkpoint", help="lamr: checkpoint directory (default: $VKV_HOME/lamr-demo/semantic-dependency)")
    p.add_argument(
        "--query-aware",
        action="store_true",
        help="text methods prune once per question with the question as the query (an upper bound; "
        "reported as question-aware)",
    )
    p.add_argument(
        "--per-turn",
        action="store_true",
        help="eviction and text methods compress each message when it ends, on top of the running "
        "compressed cache (the setting of method sequential)",
    )
    p.add_argument("--cache", help="also evaluate this compressed cache file")
    add_arguments(p.add_argument_group("scoring"), EvalSettings)
    p.add_argument("--json", help="write the eval JSON (a list of results) here")

    p = sub.add_parser("validate", help="check transcripts: schema, leakage, and with a model the context gap")
    p.add_argument("transcripts", nargs="+")
    add_model_args(p)
    p.set_defaults(model=None)
    p.add_argument("--window", type=int, default=1024, help="token windows for the model check")
    add_arguments(p.add_argument_group("scoring"), EvalSettings, skip=("max_new_tokens",))

    from vkv.sweep import add_sweep_args
    from vkv.sweep.report import add_report_args

    add_sweep_args(sub.add_parser("sweep", help="run an experiment grid (experiments/*.toml) resumably; --shard i/n"))
    add_report_args(sub.add_parser("report", help="tables, PNG plots and report.md from a sweep's results"))

    p = sub.add_parser("prune", help="prune a source file for a query with a text-level backend")
    p.add_argument("file")
    p.add_argument("--backend", required=True, choices=("longcodezip", "lamr"))
    p.add_argument("--query", required=True, help="the request the pruned file must serve")
    p.add_argument("--ratio", type=float, help="original tokens per kept token (≥ 1)")
    p.add_argument("--budget", type=int, help="hard cap on the pruned text's tokens")
    p.add_argument("--language", help="override the language detected from the extension")
    p.add_argument("--rank-only", action="store_true", help="longcodezip: coarse chunk ranking only")
    p.add_argument("--checkpoint", help="lamr: checkpoint directory")
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="lamr: keep lines scoring at least this (default: the checkpoint's, 0.4)",
    )
    p.add_argument("--no-repair", action="store_true", help="lamr: skip AST-aware repair")
    add_model_args(p)
    p.add_argument("--json", help="also write the pruned text and report here")

    from vkv.backends.lamr.cli import add_lamr_commands
    from vkv.tools.bench import add_bench_args
    from vkv.tools.memory import add_plan_args

    add_lamr_commands(sub)

    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench_command", required=True)
    add_bench_args(bsub.add_parser("optimizer", help="vkv's optimiser vs a straightforward loop and the compute floor"))
    add_plan_args(sub.add_parser("plan", help="memory budget of a compression run, computed from the model config"))

    for extension in _EXTENSIONS:
        extension(sub)
    return parser


_EXTENSIONS: list[Callable] = []


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "model", "unset") is None and args.command not in ("ask", "validate"):
        from vkv.lm.load import DEFAULT_MODEL

        args.model = DEFAULT_MODEL
    try:
        return COMMANDS[args.command](args) or 0
    except VkvError as exc:
        errors.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    except KeyboardInterrupt:
        errors.print("[yellow]interrupted[/]")
        return 130


if __name__ == "__main__":
    sys.exit(main())
