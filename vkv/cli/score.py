"""`vkv score`: score methods on any conversation, no questions needed, by how well the compressed history still
predicts the conversation's held-out last messages."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rich.table import Table

from vkv.cli.common import ModelConfig, console, load_model_from, write_json
from vkv.cli.eval import refuse_repeats, run_methods
from vkv.cli.method_flags import (
    add_recipe_and_method_args,
    build_method,
    given_options,
    method_class,
    recipe_from_args,
    refuse_unused_recipe_flags,
)
from vkv.compress.budget import DEFAULT_METHOD, DEFAULT_RATIO, span_budget
from vkv.errors import VkvError
from vkv.evals.score import ScoreEval, ScoreSettings, held_out_turn
from vkv.progress import counted, status
from vkv.settings import add_arguments, from_args, nested, setting
from vkv.text.transcript import load_transcript, render
from vkv.text.windows import turn_windows, window_transcript


@dataclass
class ScoreCommand:
    """`vkv score`'s own settings: the model, the methods and ratios, the windows and the output (the held-out part's,
    the recipe's and the methods' options are their own configs')."""

    model: ModelConfig = nested(ModelConfig)
    method: tuple[str, ...] = setting(("full", "none", DEFAULT_METHOD), "methods", metavar="M,M,…")
    ratio: tuple[float, ...] = setting(
        (DEFAULT_RATIO,), "compression ratios (span tokens per entry)", minimum=1, above=True
    )
    window: int | None = setting(
        None,
        "cut transcripts into turn windows of at most this many tokens and score each window on its own held-out "
        "messages (a window with none to hold out is skipped)",
        minimum=1,
    )
    max_windows: int | None = setting(None, "score only the first this many windows of each transcript", minimum=1)
    json: str | None = setting(None, "write the score JSON (a list of results) here")


def score_units(lm, paths: list[str], command: ScoreCommand, settings: ScoreSettings):
    """Each transcript prepared for scoring (`ScoreEval`), or with `--window` each of its first windows that has
    something to hold out; the references' prefill shown."""
    for path in paths:
        transcript = load_transcript(path)
        if not command.window:
            yield prepared(lm, transcript, settings)
            continue
        rendered = render(transcript, lm.tokenizer)
        windows = [window_transcript(transcript, a, b) for a, b in turn_windows(transcript, rendered, command.window)]
        scored = 0
        for window in windows:
            if command.max_windows and scored == command.max_windows:
                break
            try:
                held_out_turn(window, settings.holdout)
            except VkvError:  # nothing to hold out or to compress in this window: the next may have both
                continue
            scored += 1
            yield prepared(lm, window, settings)
        if not scored:
            raise VkvError(
                f"{path}: no window of --window {command.window} tokens holds both a message to compress and an "
                "assistant message to hold out; give a larger --window"
            )


def prepared(lm, transcript, settings: ScoreSettings) -> ScoreEval:
    with status(f"{transcript.id}: full and none references"):
        return ScoreEval(lm, transcript, settings)


def cmd_score(args: argparse.Namespace) -> int:
    command = from_args(ScoreCommand, args)
    refuse_repeats(command)
    classes = [method_class(name, args) for name in command.method]
    options = given_options(args, classes)
    refuse_unused_recipe_flags(args, classes)
    recipe = recipe_from_args(args)
    settings = ScoreSettings(holdout=args.holdout, seed=args.seed)
    for cls in classes:  # before the model loads: a held-out continuation has no question to give
        method = build_method(cls, recipe, args, options)
        if method.question_aware:
            raise VkvError(f"--method {method.name}: it is question-aware, and `vkv score` has no questions to give it")
    for path in args.transcripts:  # a file that cannot be read, or held out, is refused before the model loads
        transcript = load_transcript(path)
        if not command.window:
            held_out_turn(transcript, settings.holdout)
    lm = load_model_from(command.model)
    runs = sum(len(command.ratio) if cls.uses_ratio else 1 for cls in classes)
    results: list[dict] = []
    with counted(f"score: {len(args.transcripts)} transcript(s), {runs} run(s) a unit", None) as done:
        for unit in score_units(lm, args.transcripts, command, settings):
            if any(cls.uses_ratio for cls in classes):
                for ratio in command.ratio:
                    span_budget(unit.end - unit.start, ratio)
            results += run_methods(unit, command, recipe, args, options, done)
            write_json(command.json, results)
    _print_score(results)
    return 0


def _print_score(results: list[dict]) -> None:
    table = Table(title="held-out continuation: the last messages predicted from the compressed history")
    columns = ("transcript", "method", "ratio", "achieved", "scored tokens", "kept", "KL", "ll", "ll full", "ll none")
    for col in (*columns, "MiB", "seconds"):
        table.add_column(col, justify="left" if col in ("transcript", "method") else "right")
    fmt = lambda v, p=3: "—" if v is None else f"{v:.{p}f}"  # noqa: E731
    for r in results:
        s = r["summary"]
        table.add_row(
            r["transcript"],
            r["method"],
            fmt(r["ratio_requested"], 1),
            fmt(r["ratio_achieved"], 2),
            str(r["held_out"]["scored_tokens"]),
            fmt(s["kept"]),
            fmt(s["kl"], 4),
            fmt(s["ll"], 1),
            fmt(s["ll_full"], 1),
            fmt(s["ll_none"], 1),
            fmt(r["cache_memory_bytes"] / 2**20, 2),
            fmt(r["seconds"], 1),
        )
    console.print(table)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score",
        help="score methods on any conversation, no questions needed: hold out its last messages, compress the "
        "history, and measure how well the model still predicts the held-out assistant tokens",
        description="Hold out a conversation's last messages (default: the last assistant message), compress the "
        "history before them with each method (which never sees the held-out messages), and predict the held-out "
        "tokens teacher-forced from the compressed, the full and no history. Only the held-out assistant tokens are "
        "scored: tool output and user text are context, not predictions. kl: mean per-token KL(full ‖ method); ll: "
        "their log-likelihood; kept = (ll − ll none) / (ll full − ll none), the share of the full history's gain "
        "kept.",
    )
    p.set_defaults(run=cmd_score, outputs=("json",))
    p.add_argument("transcripts", nargs="+")
    add_arguments(p, ScoreCommand)
    add_recipe_and_method_args(p)
    add_arguments(p.add_argument_group("held-out part"), ScoreSettings)
