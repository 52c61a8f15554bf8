"""Experiment files: TOML grids expanded into points (one per run before windows are cut), and the method
objects they describe. See `vkv.sweep` for the file format."""

from __future__ import annotations

import dataclasses
import glob
import itertools
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import tomllib

from vkv.compress.recipe import VkvRecipe
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings
from vkv.io import check_depth, read_input_text
from vkv.lm.load import QUANTS
from vkv.methods import METHODS, get_method
from vkv.settings import Setting, check_value, flat_settings, from_flat
from vkv.upgrade import OLD_VKV_METHODS, READ_SWEEP_KEYS, RENAMED_SWEEP_KEYS, grid_point

TOP_KEYS = ("name", "description", "defaults", "eval", "grid")
MAX_SEED = 2**63 - 1  # torch.manual_seed takes no larger seed
AXIS_NAMES = {"transcripts": "transcript", "methods": "method", "ratios": "ratio", "seeds": "seed"}
UNIT_KEYS = ("window", "window_turns", "span", "max_windows")
PLAIN_KEYS = ("model", "quant", *AXIS_NAMES, *UNIT_KEYS)


def recipe_settings(recipe_class: type | None = None) -> dict[str, Setting]:
    """Grid keys that set a field of a method's recipe (nested ones flat: steps, distill_steps, verbatim_fraction),
    by key: `recipe_class`'s, or vkv's (VkvRecipe holds CompressConfig); the seed comes from `seeds`
    and the ratio from `ratios`."""
    return {s.key: s for s in flat_settings(recipe_class or VkvRecipe) if s.key != "seed"}


def _renamed(where: str, key: str) -> None:
    if key in RENAMED_SWEEP_KEYS:
        raise VkvError(f"{where}: key '{key}' was renamed; use {RENAMED_SWEEP_KEYS[key]}")


def eval_keys() -> dict[str, Any]:

    # the seed is the grid's; how many questions are scored side by side changes the speed, not a run's numbers,
    # and the cloze adds recall kept without changing another number, so neither is part of a run's identity
    # (sweeps score with the defaults, and runs made before clozes keep their ids)
    return {
        f.name: getattr(EvalSettings(), f.name)
        for f in fields(EvalSettings)
        if f.name not in ("seed", "batch", "cloze")
    }


@dataclass
class Experiment:
    path: Path
    name: str
    description: str
    grids: list[dict[str, Any]]  # [[grid]] tables merged over [defaults]
    eval: dict[str, Any] = field(default_factory=dict)

    def resolve(self, relative: str) -> Path:
        p = Path(relative).expanduser()
        return p if p.is_absolute() else (self.path.parent / p)


def load_experiment(path: str | os.PathLike) -> Experiment:
    p = Path(path)
    text = read_input_text(p, "experiment file")  # bounded; a device, FIFO or invalid UTF-8 is one sentence
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise VkvError(f"{p}: not valid TOML ({exc})") from None
    except RecursionError:  # tomllib parses nested inline arrays recursively
        raise VkvError(f"{p}: the experiment file nests arrays or tables more than Python can parse") from None
    check_depth(data, str(p), "experiment file")
    _no_unknown(p, "the top level", data, TOP_KEYS)
    defaults = _table(p, data, "defaults")
    grids = data.get("grid", [{}])
    if not isinstance(grids, list) or not all(isinstance(g, dict) for g in grids):
        raise VkvError(f"{p}: field grid must be an array of tables, written [[grid]]")
    merged = [_expand_globs(p, _merge(defaults, g)) for g in grids or [{}]]
    allowed = (*PLAIN_KEYS, *recipe_settings(), *_method_names(), *READ_SWEEP_KEYS)
    for i, grid in enumerate(merged):
        _no_unknown(p, f"[[grid]] #{i + 1}", grid, allowed)
    evals = _table(p, data, "eval")
    _no_unknown(p, "[eval]", evals, tuple(eval_keys()))
    return Experiment(p, str(data.get("name", p.stem)), str(data.get("description", "")), merged, evals)


def _expand_globs(path: Path, grid: dict) -> dict:
    """Transcript entries with wildcards (`../transcripts/test/*.json`) become the matching files, sorted."""
    entries = grid.get("transcripts")
    if entries is None:
        return grid
    expanded = []
    for entry in entries if isinstance(entries, list) else [entries]:
        if isinstance(entry, str) and any(c in entry for c in "*?["):
            base = path.parent  # an absolute pattern stays absolute; a relative one is relative to the TOML
            found = glob.glob(os.path.join(base, entry))  # each match starts with the pattern's own prefix
            matches = sorted(m if os.path.isabs(entry) else m[len(str(base)) + 1 :] for m in found)
            if not matches:
                raise VkvError(f"{path}: field transcripts: '{entry}' matches no file (relative to {base})")
            expanded += matches
        else:
            expanded.append(entry)
    return {**grid, "transcripts": expanded}


def _table(path: Path, data: dict, key: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise VkvError(f"{path}: field {key} must be a table, written [{key}]")
    return value


def _merge(defaults: dict, grid: dict) -> dict:
    out = dict(defaults)
    for k, v in grid.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _no_unknown(path: Path, where: str, table: dict, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    for key in table:
        _renamed(f"{path}: {where}", key)
        if key not in allowed:
            hint = f" (did you mean {_plural(key)}?)" if _plural(key) != key and _plural(key) in allowed else ""
            raise VkvError(f"{path}: {where}: unknown key '{key}'{hint}; known keys: {', '.join(allowed)}")


def _plural(key: str) -> str:
    return {v: k for k, v in AXIS_NAMES.items()}.get(key, key)


def _quants() -> tuple[str, ...]:

    return QUANTS


def _method_names() -> tuple[str, ...]:
    """The names a method table may have: the registry's, and vkv's earlier mode methods (read as vkv's options)."""
    return (*METHODS, *OLD_VKV_METHODS)


# ---- grid points --------------------------------------------------------------------------------------------


def expand(experiment: Experiment) -> list[dict[str, Any]]:
    """Every grid point, with the options its method does not take dropped, each kept once, in file order."""
    seen: dict[str, dict] = {}
    for i, grid in enumerate(experiment.grids):
        where = f"{experiment.path}: [[grid]] #{i + 1}"
        flat = _flatten(grid, where)
        for key in ("model", "transcripts", "methods"):
            if key not in flat:
                raise VkvError(f"{where}: field {key} is missing (set it there or under [defaults])")
        for key, value in flat.items():
            if value == []:
                raise VkvError(f"{where}: field {key} is an empty list, which would make an empty grid")
        axes = {AXIS_NAMES.get(k, k): v if isinstance(v, list) else [v] for k, v in flat.items()}
        axes.setdefault("ratio", [None])
        axes.setdefault("seed", [0])
        axes.setdefault("quant", ["auto"])
        for values in itertools.product(*axes.values()):
            point = _relevant(dict(zip(axes, values)), where)
            seen.setdefault(canonical(point), point)
    return list(seen.values())


def _flatten(grid: dict, where: str) -> dict:
    """Method tables become dotted keys: {"snapkv": {"window": 32}} → {"snapkv.window": 32}."""
    methods = _method_names()
    out = {}
    for k, v in grid.items():
        if k in methods:
            if not isinstance(v, dict):
                raise VkvError(
                    f"{where}: field {k} names a method, so it must be a table of its options, "
                    f"e.g. {k} = {{ option = value }}"
                )
            out.update({f"{k}.{opt}": val for opt, val in v.items()})
        else:
            out[k] = v
    return out


def _relevant(point: dict, where: str) -> dict:
    """Check a point's values and keep only what its method takes."""
    for key in point:
        _renamed(where, key)
    point = grid_point(point)  # vkv's earlier mode methods and switches as its options, each meaning what it did
    name = point["method"]
    if name not in METHODS:
        raise VkvError(f"{where}: field methods: unknown method '{name}'; choose from {', '.join(METHODS)}")
    cls = METHODS[name]
    out = {k: point[k] for k in ("model", "quant", "transcript", *UNIT_KEYS) if k in point}
    units = [k for k in ("window", "window_turns", "span") if k in point]
    if len(units) > 1:
        raise VkvError(f"{where}: set only one of window, window_turns and span, not {' and '.join(units)}")
    for key in ("window", "window_turns", "max_windows"):
        if key in point and (isinstance(point[key], bool) or not isinstance(point[key], int) or point[key] < 1):
            raise VkvError(f"{where}: field {key}: expected a positive integer, got {point[key]!r}")
    for key in ("model", "quant", "transcript", "span"):
        if key in point and not isinstance(point[key], str):
            raise VkvError(f"{where}: field {_plural(key)}: expected text, got {point[key]!r}")
    if point["quant"] not in _quants():
        raise VkvError(
            f"{where}: field quant: unknown quantisation '{point['quant']}'; choose one of {', '.join(_quants())}"
        )
    out["method"] = name
    out["ratio"] = _ratio(point.get("ratio"), where) if cls.uses_ratio else None
    if cls.uses_ratio and out["ratio"] is None:
        raise VkvError(f"{where}: field ratios is missing and method '{name}' needs a compression ratio")
    out["seed"] = point["seed"]
    if not isinstance(out["seed"], int) or isinstance(out["seed"], bool) or not 0 <= out["seed"] <= MAX_SEED:
        raise VkvError(
            f"{where}: field seeds: seeds are integers in 0..{MAX_SEED} (torch's range), got {out['seed']!r}"
        )
    if cls.recipe_class is not None:
        settings = recipe_settings(cls.recipe_class)
        out.update({k: check_value(settings[k], v, f"{where}: ") for k, v in point.items() if k in settings})
    options = {s.key: s for s in flat_settings(cls) if s.help}  # declared with setting(): checked as flags are
    for key, value in point.items():
        owner, _, option = key.partition(".")
        if option and owner == name:
            if option not in cls.option_names() or option == "recipe":
                taken = ", ".join(o for o in cls.option_names() if o != "recipe") or "none"
                raise VkvError(f"{where}: field {key}: method '{name}' has no option '{option}' (it takes: {taken})")
            if option in options:  # checked, not converted: a value's spelling is part of the run's id
                check_value(dataclasses.replace(options[option], key=key), value, f"{where}: ")
            out[key] = value
    return out


def _ratio(value, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
        raise VkvError(f"{where}: field ratios: a ratio is a number ≥ 1 (span tokens per entry), got {value!r}")
    return float(value)


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=jsonable)


def jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (tuple, set)):
        return list(value)
    return str(value)


def build_method(point: dict):
    """The method object a point describes; its recipe carries the run's seed."""
    name = point["method"]
    options = {
        opt: _option(name, opt, v)
        for opt, v in ((k.split(".", 1)[1], v) for k, v in point.items() if k.startswith(name + "."))
    }
    recipe_class = METHODS[name].recipe_class
    if recipe_class is not None:
        options["recipe"] = from_flat(recipe_class, point).validate()  # `seed` is a point key too
    return get_method(name, **options)


def _option(method: str, option: str, value):
    """A method option as the method takes it: a plain value (a table's settings are top-level keys)."""
    if isinstance(value, dict):
        raise VkvError(
            f"field {method}.{option}: a table was given, and method options are plain values (a recipe's settings "
            "are top-level keys)"
        )
    return value
