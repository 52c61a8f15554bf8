"""Settings declared once, as dataclass fields; command-line flags, sweep keys and dictionaries follow from them.

A config dataclass declares each setting with `setting(default, help=..., choices=...)` and each nested config
with `nested(Config, prefix=...)`. `flat_settings` walks the tree into flat keys (`steps` for `optim.steps`,
`distill_steps` for `distill.steps`); `add_arguments` turns them into flags (`--steps`, `--distill-steps`),
`from_flat` and `from_dict` build the config back, refusing unknown keys with one sentence. So a new setting is
one field: it appears in `vkv compress --help`, `vkv eval --help` and as a sweep key with no further edit.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from vkv.errors import VkvError

Choices = tuple[str, ...] | Callable[[], Iterable[str]] | type[Enum] | None


def setting(
    default: Any,
    help: str = "",
    choices: Choices = None,
    cli: bool = True,
    minimum: float | None = None,
    above: bool = False,
    required: bool = False,
    metavar: str | None = None,
    many: bool = False,
    below: float | None = None,
) -> Any:
    """A dataclass field with its help text and allowed values (`choices`: a tuple, a function returning a
    registry's names, called when they are needed, or a str-valued Enum whose member is the default: its values are
    the choices, and a value given as one becomes its member as it is checked, `check_value`, so the field holds a
    member); `cli=False` keeps it out of the command line and sweeps. A number
    with a `minimum` must be finite and at least it (above it with `above`), one with `below` finite and under it (a
    fraction in [0, 1): minimum=0, below=1): the command line, sweeps and
    `check_ranges` (each config's validate) refuse anything else alike. `required`: its flag must be given (the
    default, None, stands for "not given" in the Python API, which each config's validate refuses); `metavar`: the
    value's name in usage lines; `many`: a tuple flag that takes several words (`--sources a b`) instead of one
    comma-separated word."""
    flag = {"required": required, "metavar": metavar, "many": many}
    bound = {"minimum": minimum, "above": above, "below": below}
    return field(default=default, metadata={"help": help, "choices": choices, "cli": cli, **bound, **flag})


def threads_setting() -> Any:
    """`--threads`, a field of every config that runs the model (vkv.cli.common.ModelConfig, the sweep's)."""
    return setting(
        None,
        "CPU threads for torch (default: torch's choice; 1 is fastest when other processes share the cores)",
        minimum=1,
    )


def nested(config: type, prefix: str = "", help: str = "") -> Any:
    """A nested config's field; its settings' flat keys are `prefix` + their own names."""
    return field(default_factory=config, metadata={"nested": config, "prefix": prefix, "help": help, "cli": True})


@dataclass(frozen=True)
class Setting:
    """One leaf setting of a config tree, under its flat key."""

    key: str  # e.g. "distill_steps"
    path: tuple[str, ...]  # e.g. ("distill", "steps")
    default: Any
    kind: Any  # the field's resolved type annotation
    help: str
    choices: Choices
    minimum: float | None = None
    above: bool = False
    required: bool = False
    metavar: str | None = None
    many: bool = False
    below: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def allowed(self) -> tuple[str, ...] | None:
        if self.choices is None:
            return None
        if isinstance(self.choices, type) and issubclass(self.choices, Enum):
            return tuple(member.value for member in self.choices)
        return tuple(self.choices() if callable(self.choices) else self.choices)


def flat_settings(config: type, prefix: str = "", path: tuple[str, ...] = ()) -> list[Setting]:
    """Every leaf setting of `config` (a dataclass type), nested configs walked in field order."""
    hints = typing.get_type_hints(config)
    out = []
    for f in fields(config):
        if not f.metadata.get("cli", True):
            continue
        if "nested" in f.metadata:
            out += flat_settings(f.metadata["nested"], prefix + f.metadata["prefix"], (*path, f.name))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out.append(
            Setting(
                prefix + f.name,
                (*path, f.name),
                default,
                hints[f.name],
                f.metadata.get("help", ""),
                f.metadata.get("choices"),
                f.metadata.get("minimum"),
                f.metadata.get("above", False),
                f.metadata.get("required", False),
                f.metadata.get("metavar"),
                f.metadata.get("many", False),
                f.metadata.get("below"),
            )
        )
    return out


def out_of_range(s: Setting, value: Any) -> str | None:
    """Why `value` breaks setting `s`'s declared range, or None when it does not (None values are not numbers)."""
    return range_problem(value, s.minimum, s.above, s.below)


def range_problem(value: Any, minimum: float | None, above: bool = False, below: float | None = None) -> str | None:
    """Why `value` (a number, or a list of them) is not finite, at least `minimum` (above it with `above`) and under
    `below`; None when it is, or when there is no bound or no number."""
    if isinstance(value, (tuple, list)):  # a list of numbers: each one
        return next((p for p in (range_problem(v, minimum, above, below) for v in value) if p), None)
    if (minimum is None and below is None) or value is None or isinstance(value, bool):
        return None
    if not isinstance(value, (int, float)):
        return None
    low = minimum is not None and (value < minimum or (above and value == minimum))
    if not math.isfinite(value) or low or (below is not None and value >= below):
        if below is None:
            bound = f"{'above' if above else 'at least'} {minimum:g}"
        elif minimum is None:
            bound = f"below {below:g}"
        else:
            bound = f"in {'(' if above else '['}{minimum:g}, {below:g})"
        return f"must be a finite number {bound}, got {value!r}"
    return None


def bounded(kind: type, minimum: float | None, above: bool = False, below: float | None = None) -> Callable[[str], Any]:
    """An argparse type: `kind` parsed from the flag's text and held to the range, so the command line refuses it in
    one line before anything is loaded."""
    return kind if minimum is None and below is None else Bounded(kind, minimum, above, below)


@dataclass(frozen=True)
class Bounded:
    """`bounded`'s argparse type; a dataclass of plain values, so the command line's cached parser (vkv.cli.cached)
    can write it down and build it again without importing the configs that declared it."""

    kind: type
    minimum: float | None
    above: bool = False
    below: float | None = None

    @property
    def __name__(self) -> str:  # argparse names the type in "invalid <type> value"
        return self.kind.__name__

    def __call__(self, text: str) -> Any:
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.kind.__name__}, got {text!r}") from None
        problem = range_problem(value, self.minimum, self.above, self.below)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value


def check_ranges(config: Any, where: str = "", prefix: str = "") -> None:
    """Refuse a config (nested ones included, settings kept off the command line too) holding a number outside its
    setting's declared range."""
    for f in fields(config):
        value = getattr(config, f.name)
        if "nested" in f.metadata:
            check_ranges(value, where, prefix + f.metadata["prefix"])
            continue
        meta = f.metadata
        bound = Setting(
            prefix + f.name,
            (f.name,),
            None,
            None,
            "",
            None,
            meta.get("minimum"),
            meta.get("above", False),
            below=meta.get("below"),
        )
        problem = out_of_range(bound, value)
        if problem:
            raise VkvError(f"{where}field {bound.key}: {problem}")


def check_fields(config: Any) -> None:
    """Refuse, as a config is built, a setting's value of the wrong type, outside its range or not among its choices,
    in the sentences the command line and sweep files give (ints widened to floats, lists to tuples); a nested config
    must be one. Python callers get the error where they made it, not a failure deep inside a compression."""
    name, hints = type(config).__name__, typing.get_type_hints(type(config))
    for f in fields(config):
        value = getattr(config, f.name)
        nested_type = f.metadata.get("nested")
        if nested_type is not None:
            if not isinstance(value, nested_type):
                raise VkvError(
                    f"{name}: field {f.name}: expected a config of type {nested_type.__name__}, got {value!r}"
                )
            continue
        if "help" not in f.metadata:  # not declared with setting()
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        s = Setting(
            f.name,
            (f.name,),
            default,
            hints[f.name],
            "",
            f.metadata.get("choices"),
            f.metadata.get("minimum"),
            f.metadata.get("above", False),
            below=f.metadata.get("below"),
        )
        if default is None and value is not None:
            kinds = tuple(typing.get_origin(t) or t for t in typing.get_args(hints[f.name]) if t is not type(None))
            widened = float in kinds and isinstance(value, int) and not isinstance(value, bool)
            if kinds and not isinstance(value, (*kinds, list)) and not widened:
                expected = " or ".join(k.__name__ for k in kinds)
                raise VkvError(f"{name}: field {f.name}: expected {expected} or None, got {value!r}")
        checked = check_value(s, value, f"{name}: ")
        if checked is not value:
            object.__setattr__(config, f.name, checked)


class Config:
    """A config dataclass's dictionary form, generated once from its fields: `to_dict` is `dataclasses.asdict`,
    `from_dict` builds it back with `from_dict` below (unknown keys refused, ranges checked) and validates it. A config
    whose files from earlier versions spell things otherwise overrides `upgraded`. Every field is checked as the config
    is built (`check_fields`)."""

    def __post_init__(self) -> None:
        check_fields(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "") -> Any:
        built = from_dict(cls, cls.upgraded(data or {}), where)
        validate = getattr(built, "validate", None)
        return validate() if validate is not None else built

    @staticmethod
    def upgraded(data: dict[str, Any]) -> dict[str, Any]:
        return data


# ---- building configs back ----------------------------------------------------------------------------------


def from_dict(config: type, data: dict[str, Any], where: str = "", check: bool = True) -> Any:
    """`config` from a nested dictionary (as `dataclasses.asdict` writes it): unknown keys refused by name, lists
    become tuples, nested configs built recursively."""
    data = data or {}
    known = {f.name: f for f in fields(config)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise VkvError(f"{where}unknown {config.__name__} setting(s): {', '.join(unknown)}; known: {', '.join(known)}")
    values = {}
    for name, value in data.items():
        nested_type = known[name].metadata.get("nested")
        if nested_type is not None and isinstance(value, dict):
            values[name] = from_dict(nested_type, value, where, check=False)  # checked below, under its prefix
        else:
            values[name] = tuple(value) if isinstance(value, list) else value
    built = config(**values)
    if check:
        check_ranges(built, where)
    return built


def from_flat(config: type, flat: dict[str, Any], base: Any = None) -> Any:
    """`config` (or a copy of `base`) with the flat keys of `flat` that it has set; other keys are ignored."""
    tree = dataclasses.asdict(base) if base is not None else {}
    for s in flat_settings(config):
        if s.key in flat:
            node = tree
            for part in s.path[:-1]:
                node = node.setdefault(part, {})
            node[s.path[-1]] = flat[s.key]
    return from_dict(config, tree)


def check_value(s: Setting, value: Any, where: str) -> Any:
    """`value` as setting `s` takes it (ints widened to floats, lists to tuples, an Enum's value to its member), or
    one sentence why not."""
    default = s.default
    if default is None or isinstance(default, tuple):
        if isinstance(default, tuple) and not isinstance(value, (list, tuple)):
            raise VkvError(
                f"{where}field {s.key}: expected a list such as {list(default)}; to sweep it, give a list of lists"
            )
        return tuple(value) if isinstance(value, list) else value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    allowed = s.allowed()
    if allowed is not None and isinstance(value, str) and value not in allowed:
        raise VkvError(f"{where}field {s.key}: unknown value {value!r}; choose one of {', '.join(allowed)}")
    if isinstance(default, Enum) and isinstance(value, str):  # a member, given by its value
        value = type(default)(value)
    if type(value) is not type(default):
        raise VkvError(f"{where}field {s.key}: expected {text_type(default).__name__}, got {value!r}")
    problem = out_of_range(s, value)
    if problem:
        raise VkvError(f"{where}field {s.key}: {problem}")
    return value


# ---- the command line ---------------------------------------------------------------------------------------


def add_arguments(group: argparse._ActionsContainer, config: type, skip: Iterable[str] = ()) -> None:
    """One flag per setting of `config`, defaulting to the field's default (help text and choices from it; the
    default is appended to the help unless it is None, whose meaning the help gives, or the help names it)."""
    skip = set(skip)
    for s in flat_settings(config):
        if s.key in skip:
            continue
        default_text = ",".join(map(str, s.default)) if isinstance(s.default, tuple) else s.default
        help_text = s.help
        if s.default is not None and "default" not in s.help:
            help_text = f"{s.help} (default: {default_text})" if s.help else f"default: {default_text}"
        common = {"default": s.default, "help": help_text}
        if s.required:
            common["required"] = True
        if isinstance(s.default, bool) or set(typing.get_args(s.kind)) == {bool, type(None)}:
            group.add_argument(s.flag, action=argparse.BooleanOptionalAction, default=s.default, help=s.help)
        elif s.many:
            group.add_argument(s.flag, nargs="*", type=_element_type(s), metavar=s.metavar, **common)
        elif isinstance(s.default, tuple) or _optional_tuple(s.kind):
            group.add_argument(s.flag, type=_comma_list(s), metavar=s.metavar or "A,B,…", **common)
        else:
            group.add_argument(s.flag, type=_scalar_type(s), choices=s.allowed(), metavar=s.metavar, **common)


def from_args(config: type, args: argparse.Namespace) -> Any:
    """`config` from parsed flags (those `add_arguments` added; settings without a flag keep their defaults)."""
    return from_flat(config, {s.key: getattr(args, s.key) for s in flat_settings(config) if hasattr(args, s.key)})


def _optional_tuple(kind: Any) -> bool:
    return any(typing.get_origin(a) is tuple for a in typing.get_args(kind))


def text_type(default: Any) -> type:
    """What a setting with this default (not None) is read as from a flag: the default's type, or the text of an
    Enum member's value (the config takes the member as it is built): the flag's type stays a builtin, so the cached
    parser (vkv.cli.cached) needs no import to parse it and a wrong word is argparse's "invalid choice"."""
    return str if isinstance(default, Enum) else type(default)


def _scalar_type(s: Setting) -> Callable[[str], Any]:
    if s.default is not None:
        kind = text_type(s.default)
    else:
        real = [a for a in typing.get_args(s.kind) if a is not type(None)]
        kind = real[0] if real else str
    return bounded(kind, s.minimum, s.above, s.below)


def _element_type(s: Setting) -> type:
    """The element type of a tuple setting: its default's first element's, else the annotation's (e.g.
    tuple[float, ...] | None)."""
    if s.default:
        return type(s.default[0])
    for arg in (s.kind, *typing.get_args(s.kind)):
        if typing.get_origin(arg) is tuple:
            return typing.get_args(arg)[0]
    return float


def _comma_list(s: Setting) -> Callable[[str], tuple]:
    return CommaList(s.flag, _element_type(s), s.minimum, s.above, s.below)


@dataclass(frozen=True)
class CommaList:
    """The argparse type of a tuple setting's flag: comma-separated `element`s, each held to the setting's range (plain
    values, like `Bounded`)."""

    flag: str
    element: type
    minimum: float | None = None
    above: bool = False
    below: float | None = None

    @property
    def __name__(self) -> str:
        return f"comma-separated {self.element.__name__}s"

    def __call__(self, text: str) -> tuple:
        items = [x.strip() for x in text.split(",")]
        if not all(items):  # `3.2,,4` is a typo, not two values
            raise argparse.ArgumentTypeError(f"{self.flag}: an empty item in {text!r}")
        try:
            values = tuple(self.element(x) for x in items)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{self.flag}: expected comma-separated {self.element.__name__}s, got {text!r}"
            ) from None
        problem = range_problem(values, self.minimum, self.above, self.below)
        if problem:
            raise argparse.ArgumentTypeError(f"{self.flag}: {problem}")
        return values
