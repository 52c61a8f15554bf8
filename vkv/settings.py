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
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from vkv.errors import VkvError

Choices = tuple[str, ...] | Callable[[], Iterable[str]] | None


def setting(default: Any, help: str = "", choices: Choices = None, cli: bool = True) -> Any:
    """A dataclass field with its help text and allowed values (`choices`: a tuple, or a function returning a
    registry's names, called when they are needed); `cli=False` keeps it out of the command line and sweeps."""
    return field(default=default, metadata={"help": help, "choices": choices, "cli": cli})


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

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def allowed(self) -> tuple[str, ...] | None:
        if self.choices is None:
            return None
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
            )
        )
    return out


# ---- building configs back ----------------------------------------------------------------------------------


def from_dict(config: type, data: dict[str, Any], where: str = "") -> Any:
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
            values[name] = from_dict(nested_type, value, where)
        else:
            values[name] = tuple(value) if isinstance(value, list) else value
    return config(**values)


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
    """`value` as setting `s` takes it (ints widened to floats, lists to tuples), or one sentence why not."""
    default = s.default
    if default is None or isinstance(default, tuple):
        if isinstance(default, tuple) and not isinstance(value, (list, tuple)):
            raise VkvError(
                f"{where}field {s.key}: expected a list such as {list(default)}; to sweep it, give a list of lists"
            )
        return tuple(value) if isinstance(value, list) else value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not type(default):
        raise VkvError(f"{where}field {s.key}: expected {type(default).__name__}, got {value!r}")
    allowed = s.allowed()
    if allowed is not None and value not in allowed:
        raise VkvError(f"{where}field {s.key}: unknown value {value!r}; choose one of {', '.join(allowed)}")
    return value


# ---- the command line ---------------------------------------------------------------------------------------


def add_arguments(group: argparse._ActionsContainer, config: type, skip: Iterable[str] = ()) -> None:
    """One flag per setting of `config`, defaulting to the field's default (help text and choices from it)."""
    skip = set(skip)
    for s in flat_settings(config):
        if s.key in skip:
            continue
        default_text = ",".join(map(str, s.default)) if isinstance(s.default, tuple) else s.default
        help_text = f"{s.help} (default: {default_text})" if s.help else f"default: {default_text}"
        if isinstance(s.default, bool):
            group.add_argument(s.flag, action=argparse.BooleanOptionalAction, default=s.default, help=s.help)
        elif isinstance(s.default, tuple) or _optional_tuple(s.kind):
            group.add_argument(s.flag, type=_comma_list(s), default=s.default, help=help_text, metavar="A,B,…")
        else:
            group.add_argument(s.flag, type=_scalar_type(s), default=s.default, choices=s.allowed(), help=help_text)


def from_args(config: type, args: argparse.Namespace) -> Any:
    """`config` from parsed flags (those `add_arguments` added; settings without a flag keep their defaults)."""
    return from_flat(config, {s.key: getattr(args, s.key) for s in flat_settings(config) if hasattr(args, s.key)})


def _optional_tuple(kind: Any) -> bool:
    return any(typing.get_origin(a) is tuple for a in typing.get_args(kind))


def _scalar_type(s: Setting) -> Callable[[str], Any]:
    if s.default is not None:
        return type(s.default)
    real = [a for a in typing.get_args(s.kind) if a is not type(None)]
    return real[0] if real else str


def _comma_list(s: Setting) -> Callable[[str], tuple]:
    sample = s.default[0] if s.default else None
    element = type(sample) if sample is not None else float
    if sample is None:  # an optional tuple: its element type from the annotation, e.g. tuple[float, ...] | None
        for arg in typing.get_args(s.kind):
            if typing.get_origin(arg) is tuple:
                element = typing.get_args(arg)[0]

    def parse(text: str) -> tuple:
        try:
            return tuple(element(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{s.flag}: expected comma-separated {element.__name__}s, got {text!r}"
            ) from None

    return parse
