"""`vkv validate`: check transcripts (schema, leakage, and with a model the context gap).

The transcripts are positional arguments (hand-written: they are not settings); the flags are the fields of
`ValidateConfig` and of the scoring settings, `EvalSettings` (its answer length aside: validation generates nothing).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rich.markup import escape
from rich.table import Table

from vkv.cli.common import ModelConfig, console, load_model_from
from vkv.cli.eval import eval_units
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.evals.validate import check_static
from vkv.progress import status
from vkv.settings import add_arguments, from_args, nested, setting
from vkv.text.transcript import load_transcript

UNSCORED = ("max_new_tokens",)  # EvalSettings that validation has no use for, so no flag


@dataclass
class ValidateConfig:
    model: ModelConfig = nested(ModelConfig)
    window: int = setting(1024, "token windows for the model check", minimum=1)


def cmd_validate(args: argparse.Namespace) -> int:

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
    config = from_args(ValidateConfig, args)
    if config.model.model and checked:
        warnings += _validate_with_model(config, from_args(EvalSettings, args), checked)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    for p in problems:
        console.print(f"[bold red]problem:[/] {escape(p)}", highlight=False)
    console.print(f"{len(args.transcripts)} transcript(s): {len(problems)} problem(s), {len(warnings)} warning(s)")
    return 1 if problems else 0


def _validate_with_model(config: ValidateConfig, scoring, transcripts) -> list[str]:

    lm = load_model_from(config.model)
    min_gap, window = scoring.min_gap, config.window
    warnings = []
    counts: dict[str, list[int]] = {}  # split → [questions, usable]
    table = Table(title="no-context default and context gap per question")
    for col in ("window", "question", "no-context pick", "full-context pick", "gap (nats)"):
        table.add_column(col)
    for transcript in transcripts:
        for unit, turns in eval_units(lm, [transcript.path], None, window, None):
            with status(f"{unit.id}: full and none references"):
                ev = TranscriptEval(lm, unit, turns, scoring, allow_leaks=True)  # the static checks report leaks
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
                tally[1] += gap >= min_gap
                if len(options) > 1 and none_pick == options[0]:
                    warnings.append(f"{unit.id}: {q.id}: the model already picks the right answer with no context")
                if gap < min_gap:
                    warnings.append(f"{unit.id}: {q.id}: full-vs-none gap {gap:.2f} nats is below {min_gap}")
    console.print(table)
    for split, (questions, usable) in sorted(counts.items()):
        console.print(
            f"split {split}: {usable} of {questions} questions usable (full-vs-none gap ≥ {min_gap} "
            f"nats in {window}-token windows)"
        )
    return warnings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="check transcripts: schema, leakage, and with a model the context gap")
    p.set_defaults(run=cmd_validate)
    p.add_argument("transcripts", nargs="+")
    add_arguments(p, ValidateConfig)
    add_arguments(p.add_argument_group("scoring"), EvalSettings, skip=UNSCORED)
