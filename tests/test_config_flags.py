"""Every command's flags come from its config dataclasses: each field has its flag, and a command given no optional
flag builds a config equal to the dataclass's defaults, field by field."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass

import pytest

from vkv.backends.lamr.cli import CorpusCommandConfig, TrainCommandConfig
from vkv.cli import build_parser
from vkv.cli.ask import AskConfig
from vkv.cli.chat import ChatConfig
from vkv.cli.inspect import InspectConfig
from vkv.cli.models import FetchConfig
from vkv.cli.prune import PruneConfig
from vkv.cli.render import RenderConfig
from vkv.cli.tools import DoctorConfig
from vkv.cli.validate import ValidateConfig
from vkv.evals.runner import EvalSettings
from vkv.settings import from_args, nested, setting
from vkv.sweep import SweepConfig
from vkv.sweep.report import ReportConfig
from vkv.tools.bench import BenchConfig
from vkv.tools.bench_cache import CacheBenchConfig
from vkv.tools.memory import PlanConfig

# (the command's words with its positional arguments, its required flags' values, its configs, fields without a
# flag on purpose)
COMMANDS = [
    (["sweep", "exp.toml"], {"out": "runs"}, SweepConfig, ()),
    (["report", "runs"], {}, ReportConfig, ()),
    (["bench", "optimizer"], {}, BenchConfig, ()),
    (["bench", "cache"], {}, CacheBenchConfig, ()),
    (["plan"], {}, PlanConfig, ()),
    (["doctor"], {}, DoctorConfig, ()),
    (["prune", "f.py"], {"backend": "lamr", "query": "q"}, PruneConfig, ()),
    (["lamr", "build-corpus"], {"out": "c.jsonl"}, CorpusCommandConfig, ()),
    (["lamr", "train"], {"data": "c.jsonl", "backbone": "m", "out": "ckpt"}, TrainCommandConfig, ()),
    (["ask", "c.safetensors"], {"question": "q"}, AskConfig, ()),
    (["chat", "t.json"], {}, ChatConfig, ()),
    (["inspect", "c.safetensors"], {}, InspectConfig, ()),
    (["render", "t.json"], {}, RenderConfig, ()),
    (["validate", "t.json"], {}, ValidateConfig, ()),
    (["validate", "t.json"], {}, EvalSettings, ("max_new_tokens", "seed")),  # validation generates nothing
    (["models", "fetch", "smollm2-135m"], {}, FetchConfig, ()),
]
IDS = [f"{' '.join(words[:2])}:{config.__name__}" for words, _, config, _ in COMMANDS]


def leaves(config: type, prefix: str = "", path: tuple[str, ...] = ()) -> list[tuple[str, tuple[str, ...], object]]:
    """(flat key, path, default) of every field of `config`, nested configs walked, flagged or not."""
    out = []
    for f in dataclasses.fields(config):
        if "nested" in f.metadata:
            out += leaves(f.metadata["nested"], prefix + f.metadata["prefix"], (*path, f.name))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out.append((prefix + f.name, (*path, f.name), default))
    return out


def subparser(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """The parser of the (sub)command that `words` start with."""
    for word in words:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or word not in actions[0].choices:
            break
        parser = actions[0].choices[word]
    return parser


def missing_flags(parser: argparse.ArgumentParser, config: type, skip=()) -> list[str]:
    """Fields of `config` with no flag in `parser`, or whose flag's default differs from the field's."""
    flags = {option: action for action in parser._actions for option in action.option_strings}
    problems = []
    for key, _, default in leaves(config):
        flag = "--" + key.replace("_", "-")
        if key in skip:
            assert flag not in flags, f"{flag} is listed as having no flag, but has one"
            continue
        if flag not in flags:
            problems.append(f"{config.__name__}.{key}: no {flag}")
        elif flags[flag].default != default:
            problems.append(f"{config.__name__}.{key}: {flag} defaults to {flags[flag].default!r}, not {default!r}")
        elif isinstance(default, bool) and "--no-" + flag[2:] not in flags:
            problems.append(f"{config.__name__}.{key}: no --no-{flag[2:]}")
    return problems


def value_at(config, path: tuple[str, ...]):
    for part in path:
        config = getattr(config, part)
    return config


@pytest.mark.parametrize(("words", "required", "config", "skip"), COMMANDS, ids=IDS)
def test_every_field_of_the_config_is_a_flag_with_its_default(words, required, config, skip):
    assert missing_flags(subparser(build_parser(), words), config, skip) == []


@pytest.mark.parametrize(("words", "required", "config", "skip"), COMMANDS, ids=IDS)
def test_a_command_without_optional_flags_builds_the_default_config(words, required, config, skip):
    given = [word for key, value in required.items() for word in ("--" + key.replace("_", "-"), value)]
    built = from_args(config, build_parser().parse_args(words + given))
    for key, path, default in leaves(config):
        assert value_at(built, path) == required.get(key, default), f"{config.__name__}.{key}"


@pytest.mark.parametrize("config", sorted({c for _, _, c, _ in COMMANDS}, key=lambda c: c.__name__))
def test_every_number_field_declares_its_range(config):
    for f in dataclasses.fields(config):
        kinds = set(typing.get_args(typing.get_type_hints(config)[f.name])) | {typing.get_type_hints(config)[f.name]}
        if "nested" not in f.metadata and kinds & {int, float}:
            assert f.metadata.get("minimum") is not None, f"{config.__name__}.{f.name} has no declared range"


@dataclass
class _Grown:
    kept: int = setting(1, "a field with its flag", minimum=0)
    added: int = setting(2, "a field added later", minimum=0)
    inner: PlanConfig = nested(PlanConfig, prefix="plan_")


def test_the_check_sees_a_field_without_a_flag():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kept", type=int, default=1)
    parser.add_argument("--plan-window", type=int, default=999)
    problems = missing_flags(parser, _Grown)
    assert "_Grown.added: no --added" in problems
    assert "_Grown.plan_window: --plan-window defaults to 999, not 4096" in problems
    assert "_Grown.plan_model: no --plan-model" in problems
