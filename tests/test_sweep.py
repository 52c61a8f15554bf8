"""Sweeps: grid expansion from TOML, run identity, sharding, crash-safe results files, and a real sweep
subprocess killed with SIGKILL mid-run and resumed (each run exactly once)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT
from vkv.errors import VkvError
from vkv.sweep import (
    ResultsFile,
    build_method,
    expand,
    load_experiment,
    parse_shard,
    plan,
    read_results,
    results_name,
    take_shard,
)

MINI = str(FIXTURES / "mini-agent.json")


def write_toml(tmp_path: Path, text: str, name: str = "exp.toml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("MINI", MINI), encoding="utf-8")
    return path


GRID = """
name = "t"
[defaults]
model = "smollm2-135m"
quant = "fp32"
transcripts = ["MINI"]
seeds = [0, 1]
[[grid]]
methods = ["full", "none", "truncate"]
ratios = [2, 4]
pooling = ["uniform", "surprisal"]
[[grid]]
methods = ["vkv"]
ratios = [2.0]
pooling = ["uniform", "surprisal"]
positions = ["consecutive", "interpolate"]
steps = 3
snapkv = { window = 8 }
"""


def test_grid_expands_drops_untaken_options_and_keeps_each_point_once(tmp_path):
    points = expand(load_experiment(write_toml(tmp_path, GRID)))
    by_method = {}
    for p in points:
        by_method.setdefault(p["method"], []).append(p)
    # references: one per seed, no ratio, no pooling; truncate: ratio × seed; vkv: ratio × pooling × positions × seed
    assert len(by_method["full"]) == len(by_method["none"]) == 2
    assert all(p["ratio"] is None and "pooling" not in p for p in by_method["full"])
    assert sorted((p["ratio"], p["seed"]) for p in by_method["truncate"]) == [(2.0, 0), (2.0, 1), (4.0, 0), (4.0, 1)]
    assert len(by_method["vkv"]) == 2 * 2 * 2
    assert {(p["pooling"], p["positions"], p["steps"]) for p in by_method["vkv"]} == {
        (a, b, 3) for a in ("uniform", "surprisal") for b in ("consecutive", "interpolate")
    }
    assert all("snapkv.window" not in p for p in points)  # snapkv is not in this grid's methods
    assert len({json.dumps(p, sort_keys=True) for p in points}) == len(points)


@pytest.mark.parametrize(
    "body, message",
    [
        ("methods = ['full']\nbogus = 1", "unknown key 'bogus'"),
        ("method = ['full']", "did you mean methods"),
        ("methods = ['nope']", "unknown method 'nope'"),
        ("methods = ['truncate']", "needs a compression ratio"),
        ("methods = ['truncate']\nratios = [0.5]", "a ratio is a number ≥ 1"),
        ("methods = ['vkv']\nratios = [2]\nsteps = 'many'", "field steps: expected int"),
        ("methods = ['snapkv']\nratios = [2]\nsnapkv = { radius = 3 }", "has no option 'radius'"),
        ("methods = ['full']\nwindow = 512\nspan = 'turns:1-2'", "only one of window"),
        ("methods = ['full']\nwindow = 0", "field window: expected a positive integer"),
        ("methods = ['full']\nquant = 'int3'", "unknown quantisation 'int3'"),
        ("methods = ['vkv']\nratios = []", "field ratios is an empty list"),
        ("methods = ['full']\nsnapkv = 3", "field snapkv names a method"),
    ],
)
def test_bad_configs_fail_with_one_sentence_naming_file_and_field(tmp_path, body, message):
    path = write_toml(tmp_path, f"[defaults]\nmodel = 'smollm2-135m'\ntranscripts = ['MINI']\n[[grid]]\n{body}\n")
    with pytest.raises(VkvError, match=message) as info:
        expand(load_experiment(path))
    assert str(path) in str(info.value)


def test_the_printed_error_keeps_brackets_rich_would_read_as_markup(tmp_path, capsys):
    from vkv.cli import main

    path = write_toml(
        tmp_path, "[defaults]\nmodel = 'm'\ntranscripts = ['MINI']\n[[grid]]\nmethods = ['full']\nbogus = 1\n"
    )
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    assert "[[grid]] #1: unknown key 'bogus'" in " ".join(capsys.readouterr().err.split())


def test_bad_option_values_are_caught_when_planning(tmp_path):
    path = write_toml(
        tmp_path,
        "[defaults]\nmodel = 'm'\ntranscripts = ['MINI']\nmethods = ['vkv']\nratios = 2\npooling = 'loudest'\n",
    )
    with pytest.raises(VkvError, match=r"exp.toml: .*field pooling: unknown value 'loudest'"):
        plan(load_experiment(path), "cpu")


def test_the_earlier_hybrids_verbatim_tables_read_as_the_shared_verbatim_settings(tmp_path):
    base = "[defaults]\nmodel = 'm'\ntranscripts = ['MINI']\nmethods = ['vkv']\nratios = 3.2\n"
    new = write_toml(tmp_path, base + "verbatim = 'shared'\nverbatim_fraction = [0.1, 0.2]\n", "new.toml")
    old = base.replace("['vkv']", "['hybrid']") + "hybrid.verbatim = [{ fraction = 0.1 }, { fraction = 0.2 }]\n"
    points = expand(load_experiment(new))
    assert sorted(build_method(p).config()["shared"]["fraction"] for p in points) == [0.1, 0.2]
    runs = [[r.id for r in plan(load_experiment(p), "cpu")] for p in (new, write_toml(tmp_path, old, "old.toml"))]
    assert runs[0] == runs[1] and len(runs[0]) == 2


@pytest.mark.parametrize(
    "line, new",
    [
        ("head_share = 'adaptive'", "use head_budget"),
        ("sequential.targets = 'online'", "use the top-level key target_source"),
    ],
)
def test_a_renamed_key_names_its_new_spelling(tmp_path, line, new):
    path = write_toml(tmp_path, f"[defaults]\nmodel = 'm'\ntranscripts = ['MINI']\nmethods = ['sequential']\n{line}\n")
    with pytest.raises(VkvError, match=f"was renamed; {new}"):
        expand(load_experiment(path))


def test_missing_transcript_names_the_file_and_field(tmp_path):
    path = write_toml(tmp_path, "[defaults]\nmodel = 'm'\ntranscripts = ['nowhere.json']\nmethods = ['none']\n")
    with pytest.raises(VkvError, match=r"field transcripts: no such file nowhere.json"):
        plan(load_experiment(path), "cpu")


def test_shipped_experiments_load_and_expand():
    files = sorted((ROOT / "experiments").glob("*.toml"))
    assert {f.stem for f in files} >= {
        "cpu-quick",
        "blog-single-turn",
        "blog-failures",
        "blog-sequential",
        "blog-hybrid",
        "backends",
    }
    for f in files:
        experiment = load_experiment(f)
        points = expand(experiment)
        assert points, f
        for point in points:
            assert build_method(point).name == point["method"]
        for grid in experiment.grids:
            for t in grid["transcripts"]:
                assert experiment.resolve(t).is_file(), (f, t)


SHARDABLE = """
[defaults]
model = "no-model-needed-for-turn-windows"
quant = "fp32"
transcripts = ["MINI"]
window_turns = 3
methods = ["full", "none", "truncate", "knorm", "streaming"]
ratios = [1.5, 2, 3, 4]
seeds = [0, 1, 2]
"""


def test_run_ids_are_stable_and_shards_partition_the_grid(tmp_path):
    experiment = load_experiment(write_toml(tmp_path, SHARDABLE))
    runs = plan(experiment, "cpu")
    ids = [r.id for r in runs]
    assert len(set(ids)) == len(ids) and [r.id for r in plan(experiment, "cpu")] == ids
    shards = [{r.id for r in take_shard(runs, i, 2)} for i in range(2)]
    assert shards[0] | shards[1] == set(ids) and not shards[0] & shards[1]
    per_unit = {r.unit.label: sum(s.unit.label == r.unit.label for s in runs) for r in runs}
    assert len(per_unit) >= 2 and abs(len(shards[0]) - len(shards[1])) <= max(per_unit.values())
    for unit in per_unit:  # a window's runs (and so its references) belong to one shard
        assert sum(any(r.id in shard for r in runs if r.unit.label == unit) for shard in shards) == 1
    three = [{r.id for r in take_shard(runs, i, 3)} for i in range(3)]
    assert set().union(*three) == set(ids) and sum(map(len, three)) == len(ids)


def test_shard_argument_and_torchrun_environment(monkeypatch):
    assert parse_shard("1/4") == (1, 4)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert parse_shard(None) == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert parse_shard(None) == (2, 3)
    assert results_name(2, 3) == "results.rank2.jsonl" and results_name(0, 1) == "results.jsonl"
    for bad in ("2/2", "x", "1/0"):
        with pytest.raises(VkvError, match="--shard"):
            parse_shard(bad)


def test_results_file_cuts_a_partial_line_and_refuses_a_second_writer(tmp_path):
    path = tmp_path / "results.jsonl"
    f = ResultsFile(path)
    f.append({"run_id": "a", "result": {}})
    with pytest.raises(VkvError, match="another sweep is writing"):
        ResultsFile(path)
    f.close()
    with open(path, "ab") as raw:
        raw.write(b'{"run_id": "b", "resu')  # what a crash in the middle of a write could leave
    assert [r["run_id"] for r in read_results(tmp_path)] == ["a"]  # readers ignore it
    f = ResultsFile(path)  # the writer cuts it off
    f.append({"run_id": "c"})
    f.close()
    assert path.read_text().splitlines() == ['{"run_id": "a", "result": {}}', '{"run_id": "c"}']
    (tmp_path / "results.rank1.jsonl").write_text('{"run_id": "a"}\n{"run_id": "d"}\n')
    assert [r["run_id"] for r in read_results(tmp_path)] == ["a", "c", "d"]  # merged, each run once


# ---- a real sweep, killed and resumed ---------------------------------------------------------------------

REAL = """
name = "kill-test"
[defaults]
model = "smollm2-135m"
quant = "fp32"
transcripts = ["MINI"]
seeds = [0]
[eval]
max_new_tokens = 4
[[grid]]
methods = ["full", "none", "truncate", "knorm"]
ratios = [2, 4]
[[grid]]
methods = ["vkv"]
ratios = [2, 4]
steps = 2
"""


def sweep_cmd(config: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vkv.cli",
        "sweep",
        str(config),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--threads",
        "1",
        *extra,
    ]


def ids_in(path: Path) -> list[str]:
    return [json.loads(line)["run_id"] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.integration
def test_sigkill_mid_sweep_then_resume_runs_each_exactly_once(tmp_path, test_model_dir):
    config, out = write_toml(tmp_path, REAL), tmp_path / "out"
    planned = {r.id for r in plan(load_experiment(config), "cpu")}
    assert len(planned) == 2 + 2 * 2 + 2
    results = out / "results.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        sweep_cmd(config, out),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while len(ids_in(results)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = ids_in(results)
    assert 3 <= len(before) < len(planned), proc.stderr.read().decode()[-2000:]
    with open(results, "ab") as raw:  # and as if the kill had landed inside a write
        raw.write(b'{"run_id": "half-writ')
    done = subprocess.run(sweep_cmd(config, out), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    after = ids_in(results)
    assert after[: len(before)] == before
    assert sorted(after) == sorted(planned)  # every run exactly once
    again = subprocess.run(sweep_cmd(config, out), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and ids_in(results) == after
    assert "0 to run" in again.stdout
    line = json.loads(results.read_text().splitlines()[-1])
    assert {"run_id", "identity", "git", "seed", "wall_seconds", "peak_memory_mb", "result"} <= set(line)
    assert line["result"]["transcript"].startswith("mini-agent")


FAILING = """
[[grid]]                 # 7 turns cannot share 2 entries: this run fails, is logged, and is not a result
methods = ["vkv"]
ratios = [100]
vkv = { per_turn = true }
"""


@pytest.mark.integration
def test_two_real_shards_write_their_own_files_and_cover_the_grid(tmp_path, test_model_dir):
    config = write_toml(tmp_path, REAL.replace('"knorm"', '"none"').replace('"vkv"', '"full"') + FAILING)
    sharded = tmp_path / "sharded"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [
        subprocess.Popen(
            sweep_cmd(config, sharded, "--shard", f"{i}/2"),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    codes = [p.wait(timeout=900) for p in procs]
    runs = plan(load_experiment(config), "cpu")
    failing = next(r.id for r in runs if r.point.get("vkv.per_turn"))
    planned = {r.id for r in runs} - {failing}
    files = [ids_in(sharded / f"results.rank{i}.jsonl") for i in range(2)]
    assert set(files[0]) | set(files[1]) == planned and not set(files[0]) & set(files[1])
    assert {r["run_id"] for r in read_results(sharded)} == planned
    errors = read_results(sharded, "errors*.jsonl")
    assert [e["run_id"] for e in errors] == [failing] and "entries" in errors[0]["error"]
    assert sorted(codes) == [0, 1]  # the shard with the failed run says so


def test_transcript_wildcards_expand_to_the_matching_files_sorted(tmp_path):
    (tmp_path / "split").mkdir()
    for name in ("b.json", "a.json", "notes.txt"):
        (tmp_path / "split" / name).write_text("{}")
    path = write_toml(
        tmp_path, "[defaults]\nmodel = 'm'\ntranscripts = ['split/*.json', 'MINI']\n[[grid]]\nmethods = ['none']\n"
    )
    assert load_experiment(path).grids[0]["transcripts"] == ["split/a.json", "split/b.json", MINI]
    absolute = write_toml(  # an absolute pattern, e.g. a TOML kept outside the repository
        tmp_path / "split",
        f"[defaults]\nmodel = 'm'\ntranscripts = ['{tmp_path}/split/*.json']\n[[grid]]\nmethods = ['none']\n",
    )
    assert load_experiment(absolute).grids[0]["transcripts"] == [f"{tmp_path}/split/{n}.json" for n in "ab"]
    nested = write_toml(
        tmp_path / "split", "[defaults]\nmodel = 'm'\ntranscripts = ['../split/*.json']\n[[grid]]\nmethods = ['none']\n"
    )
    assert load_experiment(nested).grids[0]["transcripts"] == ["../split/a.json", "../split/b.json"]
    empty = write_toml(
        tmp_path,
        "[defaults]\nmodel = 'm'\ntranscripts = ['nothing/*.json']\n[[grid]]\nmethods = ['none']\n",
        name="empty.toml",
    )
    with pytest.raises(VkvError, match=r"field transcripts: 'nothing/\*.json' matches no file"):
        load_experiment(empty)


def test_eviction_methods_take_per_turn_as_a_grid_option(tmp_path):
    path = write_toml(
        tmp_path,
        "[defaults]\nmodel = 'm'\ntranscripts = ['MINI']\n[[grid]]\n"
        "methods = ['knorm', 'snapkv', 'longcodezip']\nratios = [2]\n"
        "knorm = { per_turn = true }\nsnapkv = { per_turn = true }\n"
        "longcodezip = { per_turn = true }\n",
    )
    methods = [build_method(p) for p in expand(load_experiment(path))]
    assert [m.per_turn for m in methods] == [True, True, True]


@pytest.mark.integration
def test_a_windowed_sweep_cache_records_its_window_and_answers_questions(tmp_path, test_model_dir, capsys):
    from vkv.cli import main
    from vkv.kv.file import read_header

    config = write_toml(
        tmp_path,
        "[defaults]\nmodel = 'smollm2-135m'\nquant = 'fp32'\ntranscripts = ['MINI']\nwindow = 200\nmax_windows = 1\n"
        "[[grid]]\nmethods = ['truncate']\nratios = [2]\n",
    )
    out = tmp_path / "out"
    flags = ["--save-caches", "--device", "cpu", "--threads", "1", "--batch", "0"]  # each question alone
    assert main(["sweep", str(config), "--out", str(out), *flags]) == 0
    (line,) = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert line["batch"] == 0 and line["run_id"] == plan(load_experiment(config), "cpu")[0].id  # no part of the id
    (cache,) = (out / "caches").glob("*.safetensors")
    recorded = read_header(cache)["transcript"]
    first, last = recorded["window"]  # the messages the window was cut from, as `vkv compress --window` records
    assert recorded["id"] == f"mini-agent@turns{first}-{last - 1}" and recorded["tokens"] > 0
    capsys.readouterr()
    assert (
        main(["ask", str(cache), "--quant", "fp32", "--question", "Which test runner?", "--max-new-tokens", "3"]) == 0
    )


PER_TURN = "[defaults]\nmodel = 'm'\nquant = 'fp32'\ntranscripts = ['MINI']\nratios = [3.2]\ntarget_source = 'online'\n"


def test_vkv_per_turn_plans_the_run_ids_of_its_older_name_sequential(tmp_path):
    new = write_toml(tmp_path, PER_TURN + "methods = ['vkv']\nvkv = { per_turn = [false, true] }\n", "new.toml")
    old = write_toml(tmp_path, PER_TURN + "methods = ['vkv', 'sequential']\n", "old.toml")
    ids = [[(r.point["method"], r.id) for r in plan(load_experiment(p), "cpu")] for p in (new, old)]
    assert ids[0] == ids[1] and [m for m, _ in ids[0]] == ["vkv", "vkv"]
    scalar = write_toml(tmp_path, PER_TURN + "methods = ['vkv']\nvkv = { per_turn = true }\n", "scalar.toml")
    assert [r.id for r in plan(load_experiment(scalar), "cpu")] == [ids[1][1][1]]


def test_vkv_keeping_verbatim_tokens_plans_the_run_ids_of_its_older_name_hybrid(tmp_path):
    base = PER_TURN.replace("target_source = 'online'\n", "")
    new = write_toml(tmp_path, base + "methods = ['vkv']\nvkv = { keep_verbatim = [false, true] }\n", "new.toml")
    old = write_toml(tmp_path, base + "methods = ['vkv', 'hybrid']\n", "old.toml")
    ids = [[(r.point["method"], r.id) for r in plan(load_experiment(p), "cpu")] for p in (new, old)]
    assert ids[0] == ids[1] and [m for m, _ in ids[0]] == ["vkv", "vkv"]
    both = write_toml(tmp_path, base + "methods = ['vkv']\nvkv = { per_turn = true, keep_verbatim = true }\n", "b.toml")
    older = write_toml(tmp_path, base + "methods = ['sequential']\nkeep_verbatim = true\n", "older.toml")
    assert [r.id for r in plan(load_experiment(both), "cpu")] == [r.id for r in plan(load_experiment(older), "cpu")]


def test_vkv_per_turn_takes_true_or_false(tmp_path):
    path = write_toml(tmp_path, PER_TURN + "methods = ['vkv']\nvkv = { per_turn = 'yes' }\n")
    with pytest.raises(VkvError, match="field vkv.per_turn: expected bool, got 'yes'"):
        expand(load_experiment(path))
