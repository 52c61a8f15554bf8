"""The command line starts fast: help and argument errors come from the parser's cached description (vkv.cli.cached),
which is exactly the parser built from the config dataclasses, and import neither torch nor transformers."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from vkv.cli import build_parser, main
from vkv.cli.cached import Lazy, cache_path, cached_parser, describe, rebuild


def _subcommands(parser: argparse.ArgumentParser, path=()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, (*path, name))


@pytest.fixture(scope="module")
def live():
    return build_parser()


def test_the_cached_parser_is_the_parser_it_describes(live, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    description = describe(live)
    rebuilt = rebuild(json.loads(json.dumps(description)))
    assert describe(rebuilt) == description
    pairs = list(zip(_subcommands(live), _subcommands(rebuilt), strict=True))
    assert len(pairs) > 15  # every command and subcommand (bench optimizer, lamr train, …)
    for (path, a), (same, b) in pairs:
        assert path == same and a.format_help() == b.format_help(), path


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "t.json", "--method", "full,vkv", "--ratio", "3.2,8", "--steps", "5", "--no-fit-bias"],
        ["compress", "t.json", "--out", "c.safetensors", "--head-budget", "shared", "--layer-weights", "1,2"],
        ["chat", "s.safetensors", "--temperature", "0.5"],
        ["bench", "cache", "--threads", "1"],
        ["report", "evals/x", "--out", "/tmp/r"],
    ],
)
def test_the_cached_parser_parses_as_the_live_one(live, argv):
    rebuilt = rebuild(json.loads(json.dumps(describe(live))))
    a, b = vars(live.parse_args(argv)), vars(rebuilt.parse_args(argv))
    run = b.pop("run")
    assert isinstance(run, Lazy) and run.resolve() is a.pop("run")  # the command, imported when it runs
    assert a == b


def test_an_unreadable_cache_is_rebuilt(tmp_path, monkeypatch, live):
    monkeypatch.setenv("VKV_HOME", str(tmp_path))
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text("{not json")
    assert cached_parser(lambda: live) is live  # built, and its description written again
    assert json.loads(cache_path().read_text()) == describe(live)
    assert describe(cached_parser(lambda: None)) == describe(live)  # now read from the cache


PROBE = """
import sys, time
started = time.perf_counter()
from vkv.cli import main
codes = [main(["--help"]), main(["eval", "--help"]), main(["eval", "t.json", "--ratio", "0.5"]), main(["nope"])]
heavy = sorted(m for m in ("torch", "transformers", "vkv.methods", "vkv.compress.config") if m in sys.modules)
print(codes, heavy, file=sys.stderr)
"""


@pytest.mark.integration
def test_help_and_argument_errors_import_no_torch(tmp_path):
    env = {**os.environ, "VKV_HOME": str(tmp_path)}
    cold = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert cold.stderr.splitlines()[-1].startswith("[0, 0, 2, 2]")  # the first run builds the parser and caches it
    warm = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert "--ratio: must be a finite number above 1" in warm.stderr
    assert warm.stderr.splitlines()[-1] == "[0, 0, 2, 2] []"  # nothing heavy imported


def test_importing_the_cli_imports_no_torch():
    probe = "import sys; import vkv.cli; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_lists_commands_from_the_cache(capsys):
    assert main(["--help"]) == 0
    assert "eval" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["compress", "{tmp}/missing.json", "--out", "{tmp}/c.safetensors"],
        ["chat", "{tmp}/missing.json"],
        ["eval", "{tmp}/missing.json"],
        ["ask", "{tmp}/missing.safetensors", "--question", "why?"],
    ],
)
def test_a_missing_input_is_refused_before_torch_is_imported(tmp_path, argv):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    probe = (
        "import sys; from vkv.cli import main; code = main(sys.argv[1:]); "
        "print(code, sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "VKV_HOME": str(tmp_path / "home")}
    for _ in range(2):  # the first run in a new home builds the parser's cached description, which imports torch
        run = subprocess.run([sys.executable, "-c", probe, *argv], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "2 []"
    assert f"{tmp_path}/missing" in run.stderr and "no such file" in run.stderr


def test_threads_are_set_before_the_model_loads(monkeypatch, tmp_path, capsys):
    import torch

    seen = []

    def load_model(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise KeyboardInterrupt

    monkeypatch.setattr("vkv.lm.load.load_model", load_model)
    before = torch.get_num_threads()
    transcript = os.path.join(os.path.dirname(__file__), "fixtures", "mini-agent.json")
    try:
        for command in (["compress", transcript, "--out", str(tmp_path / "c.safetensors")], ["eval", transcript]):
            assert main([*command, "--model", "smollm2-135m", "--threads", "1"]) == 130
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1]
