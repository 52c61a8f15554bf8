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
    "is --method vkv --verbatim shared",
    "--keep-verbatim": "--keep-verbatim was renamed: vkv keeping a share of the span's tokens verbatim for every head "
    "is --verbatim shared",
    "--no-keep-verbatim": "--no-keep-verbatim was renamed: vkv's verbatim part is --verbatim none, per-head or shared",
}

# vkv's modes as earlier versions registered them, as methods of their own, and the vkv options each stands for
OLD_VKV_METHODS = {"sequential": {"per_turn": True}, "hybrid": {"verbatim": "shared"}}


def method_label(name: str) -> str:
    """How tables name a method recorded as `name`: vkv's earlier mode methods as vkv with their option."""
    options = OLD_VKV_METHODS.get(name)
    return "vkv " + " ".join(f"{k}={v}" for k, v in options.items()) if options else name


def renamed_method(name: str) -> str | None:
    """The sentence refusing a method name that is now one of vkv's options (in Python and in sweep files), or
    None."""
    options = OLD_VKV_METHODS.get(name)
    if not options:
        return None
    given = ", ".join(f"{k}={v!r}" for k, v in options.items())
    return f"method '{name}' was renamed: it is method 'vkv' with {given}"


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


def vkv_recipe(d: dict[str, Any] | None) -> dict[str, Any]:
    """vkv's recipe (VkvRecipe) as earlier versions saved it, in today's spelling: a multi-turn recipe
    (MultiTurnConfig: `targets` was `target_source`; a hybrid or auto-ratio config, or None, became a switch beside
    its settings; the per-turn verbatim switch `keep_verbatim` and its settings `verbatim` are today's verbatim mode
    `shared` and its settings `shared`), or a bare virtual-token recipe (CompressConfig's settings at the top level,
    as the method vkv recorded its config)."""
    d = dict(d or {})
    if d and "compress" not in d and not set(d) & VKV_RECIPE_KEYS:  # a bare CompressConfig
        d = {"compress": d}
    if "targets" in d:
        d.setdefault("target_source", d.pop("targets"))
    for old, switch, settings in (("hybrid", "keep_verbatim", "verbatim"), ("auto_ratio", "auto_ratio", "tolerance")):
        if old in d and not isinstance(d[old], bool):
            value = d.pop(old)
            d[switch] = value is not None
            if value is not None:
                d.setdefault(settings, value)
    if isinstance(d.get("verbatim"), dict):  # the per-turn verbatim settings, before the verbatim mode took the name
        d.setdefault("shared", d.pop("verbatim"))
    if "keep_verbatim" in d:
        keep = d.pop("keep_verbatim")
        if keep:
            d["verbatim"] = "shared"
    for ran in ("per_turn", "sequential"):  # how `vkv compress` ran (`sequential` before it was `per_turn`),
        d.pop(ran, None)  # recorded beside the recipe in cache headers: not a setting
    d["compress"] = recipe(d.get("compress", {}))
    return d


def saved_session(saved: dict[str, Any]) -> tuple[Any, Any, Any]:
    """A saved session's method, its config and the seed, as `Session.save` records them today: sessions saved before
    recorded vkv's recipe (a multi-turn recipe) as `config` beside the method's name (vkv when none), and compressed by
    any other method with its defaults and the recipe's seed."""
    if "method_config" in saved:
        return saved.get("method"), saved["method_config"], saved.get("seed", 0)
    name, config = saved.get("method", "vkv"), vkv_recipe(saved.get("config", {}))
    seed = config["compress"].get("optim", {}).get("seed", 0)
    if name in ("vkv", "meanpool"):
        return name, {**config, "per_turn": False}, seed
    return name, {}, seed


VKV_RECIPE_KEYS = {
    "verbatim",
    "shared",
    "target_source",
    "targets",
    "keep_verbatim",
    "hybrid",
    "auto_ratio",
    "tolerance",
}


def method_config(name: str, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A method and its config as a run or a session recorded them, in today's spelling: vkv's earlier mode methods
    (`sequential`, `hybrid`) as vkv with their options, and vkv's recipe as `vkv_recipe` reads it."""
    if name not in (*OLD_VKV_METHODS, "vkv", "meanpool"):
        return name, config
    per_turn = bool(config.get("per_turn", OLD_VKV_METHODS.get(name, {}).get("per_turn", False)))
    config = {k: v for k, v in config.items() if k != "per_turn"}
    if name == "hybrid":  # its recipe's settings beside its `verbatim` option, the shared part's settings
        recipe_only = {k: v for k, v in config.items() if k != "verbatim"}
        config = {"compress": recipe_only, "shared": config.get("verbatim") or {}, "verbatim": "shared"}
    recipe_dict = vkv_recipe(config)
    if not isinstance(recipe_dict.get("verbatim"), str):  # recorded before the mode was a field: what the share did
        share = recipe_dict["compress"].get("verbatim_share")
        recipe_dict["verbatim"] = "per-head" if share else "none"
    return ("meanpool" if name == "meanpool" else "vkv"), {**recipe_dict, "per_turn": per_turn}


RENAMED_SWEEP_KEYS = {  # experiment-file keys earlier versions read, and what says the same today
    "head_share": "head_budget (its value all is now shared)",
    "sequential.targets": "the top-level key target_source",
    "sequential.hybrid": "the top-level keys keep_verbatim = true and verbatim_fraction, verbatim_keep_by, …",
    "sequential.auto_ratio": "the top-level keys auto_ratio = true, max_loss and ladder",
}


READ_SWEEP_KEYS = ("keep_verbatim",)  # keys earlier experiment files wrote that `grid_point` reads in today's meaning


def grid_point(point: dict[str, Any]) -> dict[str, Any]:
    """A grid point (or a run's recorded config) as an earlier version recorded it, in today's keys: the keys of
    RENAMED_SWEEP_KEYS with the meaning they had then, and vkv's earlier mode methods and switches as vkv's options
    (`sequential` is vkv with `vkv.per_turn`; `hybrid` and `keep_verbatim` are the verbatim mode `shared`)."""
    point = dict(point)
    if point.get("method") in OLD_VKV_METHODS:
        name = point["method"]
        point["method"] = "vkv"
        if OLD_VKV_METHODS[name].get("per_turn"):
            point["vkv.per_turn"] = True
        else:
            point.setdefault("verbatim", "shared")
        for key in [k for k in point if k.startswith(name + ".")]:
            point["vkv." + key.split(".", 1)[1]] = point.pop(key)
    if isinstance(point.get("vkv.verbatim"), dict):  # the hybrid's verbatim table
        point.update({"verbatim_" + k: v for k, v in point.pop("vkv.verbatim").items()})
    for key in ("keep_verbatim", "vkv.keep_verbatim"):
        if key in point:
            if point.pop(key):
                point["verbatim"] = "shared"
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
