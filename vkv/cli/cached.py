"""The command line's parser, written down once and built again without importing torch, transformers or a method.

The flags are generated from config dataclasses (vkv.settings), and those live beside the code that imports torch, so
building the parser the ordinary way (`vkv.cli.build_parser`) takes seconds. Here the built parser is described as
plain JSON (every action's attributes, argument groups and subcommands, `set_defaults` functions by dotted name) and
kept under $VKV_HOME/cache, keyed by the Python version and the size and modification time of every vkv source file:
a later `vkv --help`, `vkv eval --help` or an argument error builds the same parser from the description in a small
fraction of a second, and a command's function is imported only when it runs. Any edit to vkv's sources changes the
key, so the description is never stale; a parser that cannot be described (an unknown kind of value) is simply not
cached. `tests/test_cli_startup.py` checks that the parser built back is the parser described.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import vkv
from vkv.home import vkv_home

VERSION = 1  # of the description's format
PARSER_FIELDS = (
    "prog",
    "description",
    "epilog",
    "usage",
    "add_help",
    "allow_abbrev",
    "prefix_chars",
    "argument_default",
)


class Unserializable(Exception):
    """The parser holds something this module cannot write down; the parser is then used without a cache."""


def cached_parser(build: Callable[[], argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """The parser `build` makes, from the cached description when vkv's sources have not changed since it was
    written; otherwise built (importing what `build` imports) and its description written for next time."""
    path = cache_path()
    try:
        return rebuild(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no description yet, or one this version cannot read: build it
    parser = build()
    try:
        text = json.dumps(describe(parser))
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(text)
        os.replace(temporary, path)
        _forget_old(path.parent)
    except (Unserializable, OSError):
        pass  # a read-only home, or a flag type this module cannot describe: no cache, same parser
    return parser


KEPT = 8  # descriptions kept (of other checkouts, or of the sources before recent edits); older ones are removed


def _forget_old(folder: Path) -> None:
    described = sorted(folder.glob("cli-parser-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in described[KEPT:]:
        old.unlink(missing_ok=True)


def cache_path() -> Path:
    return vkv_home() / "cache" / f"cli-parser-{source_key()}.json"


def source_key() -> str:
    """A digest of the Python version and every vkv source file's path, size and modification time."""
    root = Path(vkv.__file__).parent
    digest = hashlib.sha256(f"{VERSION} {sys.version} {vkv.__version__} {root}".encode())
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            stat = os.stat(os.path.join(folder, name))
            digest.update(f"{folder}/{name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


# ---- describing a parser ----------------------------------------------------------------------------------------


def describe(parser: argparse.ArgumentParser) -> dict:
    """A parser as plain JSON values: its own settings, defaults, groups, and each action's attributes in the order
    they were added (subcommands described recursively)."""
    if parser._mutually_exclusive_groups:
        raise Unserializable("mutually exclusive groups")
    groups = parser._action_groups
    actions = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        group = next(i for i, g in enumerate(groups) if action in g._group_actions)
        if isinstance(action, argparse._SubParsersAction):
            if groups[group] is not parser._positionals:
                raise Unserializable("titled subcommands")
            actions.append({"group": group, "subcommands": _describe_subcommands(action)})
            continue
        attributes = {k: _encode(v) for k, v in vars(action).items() if k != "container"}
        actions.append({"group": group, "class": _name(type(action)), "attributes": attributes})
    return {
        "parser": {k: _encode(getattr(parser, k)) for k in PARSER_FIELDS},
        "formatter_class": _name(parser.formatter_class),
        "defaults": {k: _encode(v) for k, v in parser._defaults.items()},
        "groups": [{"title": g.title, "description": g.description} for g in groups],
        "actions": actions,
    }


def _describe_subcommands(action: argparse._SubParsersAction) -> dict:
    helps = {}
    for pseudo in action._choices_actions:
        if pseudo.metavar != pseudo.dest:
            raise Unserializable("subcommand aliases")
        helps[pseudo.dest] = pseudo.help
    return {
        "dest": action.dest,
        "required": action.required,
        "help": action.help,
        "metavar": action.metavar,
        "commands": [
            {"name": name, "help": helps.get(name), "has_help": name in helps, "parser": describe(sub)}
            for name, sub in action.choices.items()
        ],
    }


def _name(obj: Any) -> str:
    name = f"{obj.__module__}:{obj.__qualname__}"
    if "<" in name:  # a lambda or a function defined inside another: not importable by name
        raise Unserializable(name)
    return name


def _encode(value: Any) -> Any:
    """`value` as JSON: tuples, types, functions by dotted name and vkv's flag types (dataclasses) tagged."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise Unserializable("a dictionary with other keys than strings")
        return {"dict": {k: _encode(v) for k, v in value.items()}}
    if isinstance(value, Lazy):
        return {"function": value.name}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"dataclass": _name(type(value)), "fields": fields}
    if callable(value):
        return {"function": _name(value)}
    raise Unserializable(type(value).__name__)


# ---- building it back -------------------------------------------------------------------------------------------


class Lazy:
    """A function named `module:qualname`, imported when first called (a command's `run`, a flag's type)."""

    def __init__(self, name: str):
        self.name = name
        self.__name__ = name.rpartition(".")[2].rpartition(":")[2]
        self._target = None

    def resolve(self) -> Any:
        if self._target is None:
            module, _, qualname = self.name.partition(":")
            target: Any = importlib.import_module(module)
            for part in qualname.split("."):
                target = getattr(target, part)
            self._target = target
        return self._target

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Lazy({self.name!r})"


BUILTINS = {t.__name__: t for t in (int, float, str, bool)}


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if "dict" in value:
        return {k: _decode(v) for k, v in value["dict"].items()}
    if "dataclass" in value:
        cls = Lazy(value["dataclass"]).resolve()  # vkv.settings: no torch
        return cls(**{k: _decode(v) for k, v in value["fields"].items()})
    name = value["function"]
    module, _, qualname = name.partition(":")
    if module == "builtins" and qualname in BUILTINS:
        return BUILTINS[qualname]
    if module in ("argparse", "builtins"):
        return Lazy(name).resolve()
    return Lazy(name)


def rebuild(description: dict, parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The parser `description` describes (into `parser`, a subcommand's as `add_parser` made it, when given)."""
    if parser is None:
        fields = {k: _decode(v) for k, v in description["parser"].items()}
        parser = argparse.ArgumentParser(
            formatter_class=_decode({"function": description["formatter_class"]}), **fields
        )
    parser.set_defaults(**{k: _decode(v) for k, v in description["defaults"].items()})
    groups = [parser._positionals, parser._optionals]
    for group in description["groups"][2:]:
        groups.append(parser.add_argument_group(group["title"], group["description"]))
    for entry in description["actions"]:
        if "subcommands" in entry:
            _rebuild_subcommands(parser, entry["subcommands"])
            continue
        cls = Lazy(entry["class"]).resolve()  # argparse's own action classes
        action = cls.__new__(cls)
        vars(action).update({k: _decode(v) for k, v in entry["attributes"].items()})
        groups[entry["group"]]._add_action(action)
    return parser


def _rebuild_subcommands(parser: argparse.ArgumentParser, subcommands: dict) -> None:
    sub = parser.add_subparsers(
        dest=subcommands["dest"],
        required=subcommands["required"],
        help=subcommands["help"],
        metavar=subcommands["metavar"],
    )
    for command in subcommands["commands"]:
        description = command["parser"]
        fields = {k: _decode(v) for k, v in description["parser"].items()}
        formatter = _decode({"function": description["formatter_class"]})
        extra = {"help": command["help"]} if command["has_help"] else {}
        child = sub.add_parser(command["name"], formatter_class=formatter, **fields, **extra)
        rebuild(description, child)
