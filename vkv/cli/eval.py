"""`vkv eval`: score methods on transcripts with their factual-recall questions."""

from __future__ import annotations

import argparse
import dataclasses

from rich.table import Table

from vkv.cli.common import add_model_args, console, load_from_args, parse_list, write_json
from vkv.cli.compress import add_compress_args, compress_config_from_args
from vkv.errors import VkvError
from vkv.settings import add_arguments, bounded, from_args, range_problem


def eval_units(
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


def cmd_eval(args: argparse.Namespace) -> int:
    from vkv.cli.multiturn import method_options
    from vkv.compress.pooling import span_budget
    from vkv.evals.runner import EvalSettings, TranscriptEval
    from vkv.evals.summary import aggregate
    from vkv.lm.rebuild import load_cache
    from vkv.methods import METHODS, get_method
    from vkv.progress import step_bar
    from vkv.text.transcript import render

    methods = parse_list(args.method, str, "method")
    for name in methods:
        if name not in METHODS:
            raise VkvError(f"--method: unknown method '{name}'; choose from {', '.join(METHODS)}")
        if args.per_turn and METHODS[name].uses_ratio and "per_turn" not in METHODS[name].option_names():
            per_turn = ", ".join(n for n, c in METHODS.items() if "per_turn" in c.option_names())
            raise VkvError(
                f"--per-turn: method '{name}' has no per-turn mode (methods with one: {per_turn}; vkv's "
                "is the method sequential)"
            )
    options = method_option_values(args, [METHODS[name] for name in methods])
    ratios = parse_list(args.ratio, float, "ratio")
    problem = range_problem(ratios, 1, above=True)
    if problem:
        raise VkvError(f"--ratio: every ratio {problem}")
    compress_config = compress_config_from_args(args)
    settings = dataclasses.replace(from_args(EvalSettings, args), seed=args.seed)
    lm = load_from_args(args)
    results = []
    for transcript, turns in eval_units(lm, args.transcripts, args.span, args.window, args.max_windows, args.span_only):
        start, end = render(transcript, lm.tokenizer).token_span(*(turns or transcript.default_span()))
        for ratio in ratios if any(METHODS[name].uses_ratio for name in methods) else []:
            span_budget(end - start, ratio)  # before the references' prefill
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
                **options,
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


def method_option_values(args: argparse.Namespace, classes: list) -> dict:
    """--head-budget, --mass and every --option KEY=VALUE, typed like the methods' dataclass fields; each is given
    to the methods that have that option (a key that none of them has is an error)."""
    import dataclasses

    pairs = [("head_budget", args.head_budget), ("mass", args.mass)]
    for text in args.option or []:
        key, sep, value = text.partition("=")
        if not sep:
            raise VkvError(f"--option {text!r}: expected KEY=VALUE, e.g. --option selection=omp")
        pairs.append((key.strip().replace("-", "_"), value.strip()))
    values = {}
    for key, value in pairs:
        if value is None:
            continue
        owners = [f for cls in classes for f in dataclasses.fields(cls) if f.name == key and f.init]
        if not owners:
            raise VkvError(f"--option {key}: none of the methods {', '.join(c.name for c in classes)} has it")
        default = owners[0].default
        try:
            if isinstance(default, bool):
                if value.lower() not in ("true", "false"):
                    raise ValueError(value)
                values[key] = value.lower() == "true"
            else:
                values[key] = type(default)(value) if default is not None else value
        except ValueError:
            raise VkvError(f"--option {key}={value}: expected a {type(default).__name__}") from None
    return values


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


def register(sub: argparse._SubParsersAction) -> None:
    from vkv.cli.multiturn import add_multiturn_args
    from vkv.evals.runner import EvalSettings

    p = sub.add_parser("eval", help="score methods on transcripts with the factual-recall questions")
    p.set_defaults(run=cmd_eval, outputs=("json",))
    p.add_argument("transcripts", nargs="+")
    add_model_args(p)
    p.add_argument("--method", default="full,none,truncate,vkv", help="comma-separated methods")
    add_compress_args(p, several_ratios=True)
    p.add_argument(
        "--window", type=bounded(int, 1), help="cut transcripts into turn windows of at most this many tokens"
    )
    p.add_argument("--max-windows", type=bounded(int, 1), help="evaluate only the windows with the most questions")
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
        help="eviction, text, am and kvzip methods compress each message when it ends, on top of the running "
        "compressed cache (the setting of method sequential)",
    )
    p.add_argument(
        "--head-budget",
        choices=("shared", "uniform", "adaptive"),
        help="scoring methods (knorm, snapkv, kvzip, am): the same tokens in every KV head, each head its own "
        "budget, or AdaKV's adaptive split",
    )
    p.add_argument(
        "--mass", choices=("none", "nearest"), help="eviction methods: bias each kept entry by the tokens it stands for"
    )
    p.add_argument(
        "--option",
        action="append",
        metavar="KEY=VALUE",
        help="any method option (a field of its dataclass, as in sweep files), for every method that has it; "
        "repeatable, e.g. --option selection=omp --option bias=fit",
    )
    p.add_argument("--cache", help="also evaluate this compressed cache file")
    add_arguments(p.add_argument_group("scoring"), EvalSettings)
    p.add_argument("--json", help="write the eval JSON (a list of results) here")
