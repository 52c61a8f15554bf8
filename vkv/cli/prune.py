"""`vkv prune` and `vkv lamr`: the text-level backends on a source file."""

from __future__ import annotations

import argparse

from vkv.cli.common import add_model_args, console
from vkv.errors import VkvError


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


def cmd_lamr(args: argparse.Namespace) -> int:
    from vkv.backends.lamr.cli import run_lamr

    return run_lamr(args, console)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prune", help="prune a source file for a query with a text-level backend")
    p.set_defaults(run=cmd_prune, outputs=("json",))
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

    add_lamr_commands(sub).set_defaults(run=cmd_lamr)
