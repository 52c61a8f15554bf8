"""Every command's flags come from its config dataclasses: each field has its flag, and a command given no optional
flag builds a config equal to the dataclass's defaults, field by field."""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from dataclasses import dataclass

import pytest

from vkv.backends.lamr.cli import CorpusCommandConfig, TrainCommandConfig
from vkv.cli import build_parser, main
from vkv.cli.ask import AskConfig
from vkv.cli.chat import ChatConfig
from vkv.cli.compress import CompressCommand
from vkv.cli.eval import EvalCommand
from vkv.cli.inspect import InspectConfig
from vkv.cli.method_flags import build_method as build_method_from_flags
from vkv.cli.method_flags import given_options, method_options, recipe_from_args
from vkv.cli.models import FetchConfig
from vkv.cli.prune import PruneConfig
from vkv.cli.render import RenderConfig
from vkv.cli.tools import DoctorConfig
from vkv.cli.validate import ValidateConfig
from vkv.compress.recipe import VkvRecipe
from vkv.evals.runner import EvalSettings
from vkv.methods import METHODS
from vkv.settings import from_args, nested, setting
from vkv.sweep import SweepConfig
from vkv.sweep.grid import build_method, expand, load_experiment
from vkv.sweep.report import ReportConfig
from vkv.tools.bench_cache import CacheBenchConfig
from vkv.tools.bench_compress import CompressBenchConfig
from vkv.tools.bench_optimizer import BenchConfig
from vkv.tools.memory import PlanConfig

# (the command's words with its positional arguments, its required flags' values, its configs, fields without a
# flag on purpose)
COMMANDS = [
    (["sweep", "exp.toml"], {"out": "runs"}, SweepConfig, ()),
    (["report", "runs"], {}, ReportConfig, ()),
    (["bench", "optimizer"], {}, BenchConfig, ()),
    (["bench", "cache"], {}, CacheBenchConfig, ()),
    (["bench", "compress"], {}, CompressBenchConfig, ()),
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
    (["compress", "t.json"], {"out": "c.safetensors"}, CompressCommand, ()),
    (["compress", "t.json"], {"out": "c.safetensors"}, VkvRecipe, ()),
    (["eval", "t.json"], {}, EvalCommand, ()),
    (["eval", "t.json"], {}, EvalSettings, ()),  # its seed is the recipe's --seed
    (["chat", "t.json"], {}, VkvRecipe, ("target_source",)),  # a chat's targets come from its running cache
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
    shared = {"--" + key.replace("_", "-") for key in method_options()}  # unset (None): each method's own default
    problems = []
    for key, _, default in leaves(config):
        flag = "--" + key.replace("_", "-")
        if key in skip:
            assert flag not in flags, f"{flag} is listed as having no flag, but has one"
            continue
        if flag not in flags:
            problems.append(f"{config.__name__}.{key}: no {flag}")
        elif flags[flag].default != default and not (flag in shared and flags[flag].default is None):
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
    args = build_parser().parse_args(words + given)
    if config is VkvRecipe:  # as the commands build it: validated, its resolved defaults filled in
        built, defaults = recipe_from_args(args), VkvRecipe().validate()
    else:
        built, defaults = from_args(config, args), None
    for key, path, default in leaves(config):
        expected = value_at(defaults, path) if defaults else default
        assert value_at(built, path) == required.get(key, expected), f"{config.__name__}.{key}"


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


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_option_is_a_flag_of_eval_and_a_sweep_key_with_its_default(name, tmp_path):
    """Each option a method declares with `setting` has a `vkv eval` flag; with no flag the method is built with its
    own defaults, and a sweep that sets an option to its default describes the same run as one that leaves it out."""
    cls = METHODS[name]
    options = method_options()
    flags = {o for a in subparser(build_parser(), ["eval"])._actions for o in a.option_strings}
    args = build_parser().parse_args(["eval", "t.json", "--method", name])
    built = build_method_from_flags(cls, recipe_from_args(args), args, given_options(args, [cls]))
    assert built.config() == cls().config()
    (tmp_path / "t.json").write_text("{}")
    head = f'[defaults]\nmodel = "m"\ntranscripts = ["t.json"]\n[[grid]]\nmethods = ["{name}"]\nratios = [2]\n'
    (tmp_path / "plain.toml").write_text(head)
    (plain,) = expand(load_experiment(tmp_path / "plain.toml"))
    declared = [f for f in dataclasses.fields(cls) if f.init and "help" in f.metadata]
    configs = ("recipe", "verbatim", "settings")  # config objects: their fields are flags and keys of their own
    undeclared = [f.name for f in dataclasses.fields(cls) if f.init and "help" not in f.metadata]
    assert [n for n in undeclared if n not in configs] == [], f"{name}: options not declared with setting()"
    for f in declared:
        key = next(k for k, o in options.items() if o.field == f.name and name in o.owners)
        assert options[key].setting.flag in flags, f"{name}.{f.name}: no flag"
        if f.default is None:  # TOML has no null
            continue
        (tmp_path / "set.toml").write_text(head + f"{name} = {{ {f.name} = {json.dumps(f.default)} }}\n")
        (point,) = expand(load_experiment(tmp_path / "set.toml"))
        assert build_method(point).config() == build_method(plain).config(), f"{name}.{f.name}"


def test_a_declared_upper_bound_is_held_alike_by_flags_files_and_python(capsys):
    """`below` (a fraction in [0, 1)) is a declared range like `minimum`: one sentence from the command line, from
    a config built in Python, and for each number of a comma list."""
    from vkv.compress.hybrid import HybridConfig
    from vkv.compress.optimise import OptimConfig
    from vkv.errors import VkvError

    with pytest.raises(VkvError, match=r"field betas: must be a finite number in \[0, 1\), got 1.0"):
        OptimConfig(betas=(0.9, 1.0)).validate()
    with pytest.raises(VkvError, match=r"field max_share: must be a finite number in \[0, 1\), got 1.0"):
        HybridConfig(max_share=1.0).validate()
    assert HybridConfig(max_share=0.99).validate().max_share == 0.99
    assert main(["eval", "t.json", "--method", "vkv", "--verbatim", "shared", "--verbatim-fraction", "1"]) == 2
    assert "must be a finite number in [0, 1), got 1.0" in capsys.readouterr().err
    assert main(["eval", "t.json", "--method", "vkv", "--betas", "0.9,1.5"]) == 2
    assert "--betas: must be a finite number in [0, 1), got 1.5" in capsys.readouterr().err
