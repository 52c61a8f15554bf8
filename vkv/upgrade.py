"""What earlier versions spelled otherwise, in one place. Saved files (recipes in cache headers, sessions, `--json`
outputs) are rewritten into today's spelling as they load, with the meaning they had then, so old files keep
loading; a renamed flag is refused in one sentence naming today's, since a command line is typed again, not stored,
and so is a renamed key of an experiment file (an edit of the file fixes it for good), while the grid points its
finished runs recorded are read in today's keys (`grid_point`), so that their ids can be remapped, not rerun.

Pure dictionary and string work: every layer may import it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

RENAMED_FLAGS = {  # an old flag, or flag=value, and the sentence that names what replaced it
    "--sequential": "--sequential was renamed: per-turn compression is --per-turn (each message compressed on its own "
    "when it ends, on the running cache)",
    "--method=sequential": "method 'sequential' was renamed: vkv compressing each message on its own is "
    "--method vkv --per-turn",
    "--method=hybrid": "method 'hybrid' was renamed: vkv keeping a share of the span's tokens verbatim for every head "
    "is --method vkv --keep-verbatim",
}


def old_flag(argv: Sequence[str]) -> str | None:
    """The sentence refusing the first renamed flag in `argv` (`--flag value` or `--flag=value`, a value of
    --method among its comma-separated list), or None."""
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        flag, eq, value = arg.partition("=")
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        if flag in RENAMED_FLAGS:
            return RENAMED_FLAGS[flag]
        for v in value.split(","):
            if f"{flag}={v}" in RENAMED_FLAGS:
                return RENAMED_FLAGS[f"{flag}={v}"]
    return None


def recipe(d: dict[str, Any] | None) -> dict[str, Any]:
    """vkv's recipe (CompressConfig) as earlier versions saved it, in today's spelling and with the meaning it had
    then: the ratio lived in the recipe before each command took its own, `head_share` (all, uniform, adaptive)
    became the `head_budget` every method shares (shared, uniform, adaptive), and a recipe saved before a setting
    existed ran without it (share_scores readout, no verbatim share, no logit offset, a verbatim part of the span's
    own entries; every saved recipe records proportional_attention)."""
    d = {k: v for k, v in (d or {}).items() if k != "ratio"}
    if d:
        d.setdefault("share_scores", "readout")
        d.setdefault("verbatim_share", 0.0)
        d.setdefault("virtual_offset", 0.0)
        d.setdefault("verbatim_source", "kvzip")
    if "head_share" in d:
        share = d.pop("head_share")
        d.setdefault("head_budget", "shared" if share == "all" else share)
    return d


def multiturn(d: dict[str, Any] | None) -> dict[str, Any]:
    """A multi-turn recipe (MultiTurnConfig) as sessions saved by earlier versions record it, in today's spelling:
    `targets` is `target_source`; a hybrid or auto-ratio config (or None) is a switch beside its settings (the hybrid
    is the per-turn verbatim share, `keep_verbatim`)."""
    d = dict(d or {})
    if "targets" in d:
        d.setdefault("target_source", d.pop("targets"))
    for old, switch, settings in (("hybrid", "keep_verbatim", "verbatim"), ("auto_ratio", "auto_ratio", "tolerance")):
        if old in d and not isinstance(d[old], bool):
            value = d.pop(old)
            d[switch] = value is not None
            if value is not None:
                d.setdefault(settings, value)
    for ran in ("per_turn", "sequential"):  # how `vkv compress` ran (`sequential` before it was `per_turn`),
        d.pop(ran, None)  # recorded beside the recipe in cache headers: not a setting
    d["compress"] = recipe(d.get("compress", {}))
    return d


RENAMED_SWEEP_KEYS = {  # experiment-file keys earlier versions read, and what says the same today
    "head_share": "head_budget (its value all is now shared)",
    "sequential.targets": "the top-level key target_source",
    "sequential.hybrid": "the top-level keys keep_verbatim = true and verbatim_fraction, verbatim_keep_by, …",
    "sequential.auto_ratio": "the top-level keys auto_ratio = true, max_loss and ladder",
}


def grid_point(point: dict[str, Any]) -> dict[str, Any]:
    """A grid point (or a run's recorded config) as an earlier version recorded it, in today's keys: the keys of
    RENAMED_SWEEP_KEYS with the meaning they had then."""
    point = dict(point)
    if "head_share" in point:
        share = point.pop("head_share")
        point["head_budget"] = "shared" if share == "all" else share
    if "sequential.targets" in point:
        point["target_source"] = point.pop("sequential.targets")
    for old, switch, prefix in (
        ("sequential.hybrid", "keep_verbatim", "verbatim_"),
        ("sequential.auto_ratio", "auto_ratio", ""),
    ):
        table = point.pop(old, None)
        if table is not None:
            point[switch] = True
            point.update({prefix + k: v for k, v in table.items()})
    return point
