"""Command-line glue for multi-turn compression: arguments, their settings, and a transcript compressed turn
by turn (or as one hybrid / auto-ratio unit) into a cache file's SplicedCache.

    vkv compress T --out C --sequential [--target-source oracle|online] [--hybrid [0.15] --keep-by v-uniqueness]
                                       [--auto-ratio --max-loss X [--ladder 1.5,2,3,4,6,8]]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from vkv.compress.autoratio import DEFAULT_LADDER, AutoRatioConfig
from vkv.compress.config import CompressConfig
from vkv.compress.hybrid import KEEP_BY, HybridConfig
from vkv.compress.sequential import (
    TARGET_MODES,
    FullHistory,
    MultiTurnConfig,
    Turn,
    append_verbatim,
    compress_turns,
    message_turns,
)
from vkv.compress.single import render_within_positions
from vkv.errors import VkvError
from vkv.kv.file import cache_metadata, transcript_record
from vkv.kv.segment import Segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM


def add_multiturn_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("multi-turn")
    g.add_argument("--sequential", action="store_true", help="compress each message of the span on its own, in order")
    g.add_argument(
        "--target-source",
        dest="targets",
        default="oracle",
        choices=TARGET_MODES,
        help="oracle: V from the full uncompressed history; online: V on top of the compressed cache",
    )
    g.add_argument(
        "--hybrid",
        type=float,
        nargs="?",
        const=HybridConfig().fraction,
        default=None,
        metavar="FRACTION",
        help=f"keep this share of tokens verbatim (default {HybridConfig().fraction}) and compress the rest",
    )
    g.add_argument("--keep-by", default=HybridConfig().keep_by, choices=KEEP_BY, help="which tokens --hybrid keeps")
    g.add_argument(
        "--max-verbatim-share",
        type=float,
        default=HybridConfig().max_share,
        help="verbatim tokens take at most this share of a turn's entry budget (short-turn rule)",
    )
    g.add_argument(
        "--auto-ratio",
        action="store_true",
        help="per turn, the highest ratio of --ladder whose V loss stays within --max-loss",
    )
    g.add_argument("--max-loss", type=float, help="tolerance of --auto-ratio (normalised V loss, layer mean)")
    g.add_argument("--ladder", default=",".join(f"{r:g}" for r in DEFAULT_LADDER), help="ratios --auto-ratio tries")


def wants_multiturn(args: argparse.Namespace) -> bool:
    """Whether `vkv compress` should go through compress_multiturn instead of the single-span path."""
    return bool(args.sequential or args.hybrid is not None or args.auto_ratio)


def verbatim_config(args: argparse.Namespace) -> HybridConfig:
    fraction = HybridConfig().fraction if args.hybrid is None else args.hybrid
    return HybridConfig(fraction, args.keep_by, args.max_verbatim_share).validate()


def auto_ratio_config(args: argparse.Namespace) -> AutoRatioConfig | None:
    if args.max_loss is not None and not args.auto_ratio:
        raise VkvError("--max-loss is the tolerance of --auto-ratio; add --auto-ratio")
    if not args.auto_ratio:
        return None
    if args.max_loss is None:
        raise VkvError("--auto-ratio needs a tolerance: add --max-loss (normalised V loss, e.g. 0.3)")
    try:
        ladder = tuple(float(r) for r in args.ladder.split(",") if r.strip())
    except ValueError:
        raise VkvError(f"--ladder {args.ladder!r}: expected comma-separated ratios, e.g. 1.5,2,3,4,6,8") from None
    return AutoRatioConfig(args.max_loss, ladder).validate()


def multiturn_config(config: CompressConfig, args: argparse.Namespace) -> MultiTurnConfig:
    hybrid = verbatim_config(args) if args.hybrid is not None else None
    return MultiTurnConfig(config, args.targets, hybrid, auto_ratio_config(args)).validate()


def method_options(args: argparse.Namespace) -> dict[str, Any]:
    """Options for `get_method(name, compress=..., **method_options(args))` in `vkv eval`: sequential takes
    targets, hybrid (only with --hybrid) and auto_ratio; the hybrid method takes verbatim."""
    return {
        "targets": args.targets,
        "hybrid": verbatim_config(args) if args.hybrid is not None else None,
        "auto_ratio": auto_ratio_config(args),
        "verbatim": verbatim_config(args),
    }


def compress_multiturn(
    lm: FrozenLM,
    transcript,
    turns: tuple[int, int],
    config: CompressConfig,
    args: argparse.Namespace,
    on_turn: Callable[[Turn, Segment], None] | None = None,
) -> SplicedCache:
    """Messages [turns[0], turns[1]) compressed (one segment per message with --sequential, else one unit);
    messages before kept with their full-context K/V, messages after re-encoded on top; one segment each."""
    plan = multiturn_config(config, args)
    rendered = render_within_positions(lm, transcript)
    start, end = rendered.token_span(*turns)
    starts, roles = [s.start for s in rendered.spans], [s.role for s in rendered.spans]
    messages = message_turns(starts, roles, 0, len(rendered.ids))
    span = messages[turns[0] : turns[1]] if args.sequential else [Turn(turns[0], turns[1], None, start, end)]
    history = FullHistory.capture(lm, rendered.ids, start, end)
    spliced = SplicedCache()
    for turn in messages[: turns[0]]:
        spliced.append(history.verbatim(turn))
    compress_turns(lm, rendered.ids, span, spliced, plan, history, starts, on_turn)
    append_verbatim(lm, spliced, rendered.ids, messages[turns[1] :])
    spliced.meta = cache_metadata(
        lm,
        transcript=transcript_record(transcript, turns, len(rendered.ids)),
        config=config.to_dict(),
        multiturn={**plan.to_dict(), "sequential": bool(args.sequential)},
    )
    return spliced
