"""`vkv eval`: score methods on transcripts with their factual-recall questions."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from rich.table import Table

from vkv.cli.common import ModelConfig, console, load_model_from, trust_foreign_setting, write_json
from vkv.cli.method_flags import (
    add_recipe_and_method_args,
    build_method,
    given_options,
    method_class,
    recipe_from_args,
    refuse_unused_recipe_flags,
)
from vkv.compress.budget import DEFAULT_RATIO, span_budget
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.evals.summary import aggregate
from vkv.kv.file import trusted_header
from vkv.lm.rebuild import load_cache
from vkv.progress import counted, status, step_bar
from vkv.settings import add_arguments, from_args, nested, setting
from vkv.text.transcript import load_transcript, parse_turn_span, render
from vkv.text.windows import select_windows, window_transcript
from vkv.upgrade import method_label


def eval_units(
    lm, paths: list[str], span: str | None, window: int | None, max_windows: int | None, span_only: bool = False
):
    """(transcript, turns) for each evaluation unit: whole transcripts, a span, the span alone, or windows."""
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


@dataclass
class EvalCommand:
    """`vkv eval`'s own settings: the model, the methods and ratios, the evaluated units and the outputs (the recipe's,
    the methods' options and the scoring's are their own configs')."""

    model: ModelConfig = nested(ModelConfig)
    method: tuple[str, ...] = setting(("full", "none", "truncate", "vkv"), "methods", metavar="M,M,…")
    ratio: tuple[float, ...] = setting(
        (DEFAULT_RATIO,), "compression ratios (span tokens per entry)", minimum=1, above=True
    )
    span: str | None = setting(None, "turns:A-B (inclusive message indices); default: all after the system message")
    window: int | None = setting(None, "cut transcripts into turn windows of at most this many tokens", minimum=1)
    max_windows: int | None = setting(None, "evaluate only the windows with the most questions", minimum=1)
    span_only: bool = setting(
        False,
        "evaluate the --span turns as their own window: system message + those turns, later turns dropped, questions "
        "first answered there",
    )
    cache: str | None = setting(None, "also evaluate this compressed cache file")
    trust_foreign: bool = trust_foreign_setting()
    allow_leaks: bool = setting(
        False,
        "score questions whose answers the uncompressed messages or the question give away (vkv validate lists them)",
    )
    json: str | None = setting(None, "write the eval JSON (a list of results) here")


def cmd_eval(args: argparse.Namespace) -> int:

    command = from_args(EvalCommand, args)
    methods = command.method
    refuse_repeats(command)
    classes = [method_class(name, args) for name in methods]
    options = given_options(args, classes)
    refuse_unused_recipe_flags(args, classes)
    ratios = command.ratio
    recipe = recipe_from_args(args)
    settings = dataclasses.replace(from_args(EvalSettings, args), seed=args.seed)
    for path in args.transcripts:  # a file that cannot be read is refused before the model loads
        load_transcript(path)
    if command.cache:  # and so is a cache file that is not this user's
        trusted_header(command.cache, command.trust_foreign)
    lm = load_model_from(command.model)
    units = list(eval_units(lm, args.transcripts, command.span, command.window, command.max_windows, command.span_only))
    per_unit = bool(command.cache) + sum(len(ratios) if cls.uses_ratio else 1 for cls in classes)
    results = []
    with counted(f"eval: {len(units)} unit(s) × {per_unit} run(s)", len(units) * per_unit) as done:
        for transcript, turns in units:
            results += _eval_unit(lm, transcript, turns, command, recipe, settings, args, options, done)
            if command.json:
                write_json(command.json, results)
    _print_eval(results, aggregate(results))
    return 0


def refuse_repeats(command) -> None:
    """A method or ratio listed twice in `command` (one with `method` and `ratio` settings) is refused."""
    for flag, values in (("--method", command.method), ("--ratio", command.ratio)):
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise VkvError(f"{flag}: {', '.join(map(str, twice))} listed twice; each run would be scored twice")


def _eval_unit(lm, transcript, turns, command: EvalCommand, recipe, settings, args, options, done) -> list[dict]:
    """One unit's results: the cache's (when given), then each method at each ratio; `done()` after each run."""
    start, end = render(transcript, lm.tokenizer).token_span(*(turns or transcript.default_span()))
    names, ratios = command.method, command.ratio
    for ratio in ratios if any(method_class(name, args).uses_ratio for name in names) else []:
        span_budget(end - start, ratio)  # before the references' prefill
    with status(f"{transcript.id}: full and none references"):
        evaluation = TranscriptEval(lm, transcript, turns, settings, command.allow_leaks)
    results = []
    if command.cache:
        results.append(evaluation.evaluate_cache(load_cache(command.cache, lm, command.trust_foreign)))
        done()
    return results + run_methods(evaluation, command, recipe, args, options, done)


def run_methods(evaluation, command, recipe, args, options, done) -> list[dict]:
    """Each of `command`'s methods at each of its ratios (one ratio-free run for a method without one) on a prepared
    unit (`evaluation.evaluate`), its steps or elapsed time shown; `done()` after each run."""
    results = []
    for name in command.method:
        method = build_method(method_class(name, args), recipe, args, options)
        for ratio in command.ratio if method.uses_ratio else [None]:
            label = f"{evaluation.transcript.id} {name}" + (f" @ {ratio}×" if ratio else "")
            if method.reports_steps:
                with step_bar(label, recipe.compress.optim.steps) as on_step:
                    results.append(evaluation.evaluate(method, ratio, on_step))
            else:
                with status(label):
                    results.append(evaluation.evaluate(method, ratio))
            done()
    return results


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
        "recall kept",
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
            "—" if r["recall_questions"] is None else f"{fmt(r['recall_kept'])} (of {r['recall_questions']})",
            fmt(r["fidelity_kl"]),
            fmt(r["seconds"], 1),
        )
    console.print(table)
    per_q = Table(title="retention per question (weak questions in brackets)")
    per_q.add_column("window / question")
    columns = [(r["method"], r["ratio_requested"]) for r in results if r["transcript"] == results[0]["transcript"]]
    for method, ratio in columns:
        per_q.add_column(method_label(method) + (f" {ratio}×" if ratio else ""), justify="right")
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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="score methods on transcripts with the factual-recall questions")
    p.set_defaults(run=cmd_eval, outputs=("json",))
    p.add_argument("transcripts", nargs="+")
    add_arguments(p, EvalCommand)
    add_recipe_and_method_args(p)
    add_arguments(p.add_argument_group("scoring"), EvalSettings)
