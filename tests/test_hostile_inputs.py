"""Bad input, one row per class: a non-zero exit with one sentence naming the field (or flag), no traceback, and every
file that existed before byte-identical after. Corrupted cache files have their own test (test_cache_mutations.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from vkv.cli import main

TRANSCRIPT = FIXTURES / "mini-agent.json"
MODEL = ["--model", "smollm2-135m", "--quant", "fp32"]


def prepare(tmp: Path) -> dict[str, Path]:
    """Files the rows point at; `existing` must survive every row unchanged."""
    (tmp / "adir").mkdir()
    (tmp / "existing.safetensors").write_bytes(b"keep me")
    (tmp / "existing.json").write_text('{"keep": true}')
    (tmp / "noise.safetensors").write_bytes(bytes(range(256)) * 4)
    bad = json.loads(TRANSCRIPT.read_text())
    bad["questions"][0]["choices"] = []
    (tmp / "empty-choices.json").write_text(json.dumps(bad))
    other = tmp / "other-schema"
    other.mkdir()
    (other / "results.jsonl").write_text(json.dumps({"run_id": "x", "result": {"method": "m"}}) + "\n")
    binary = tmp / "binary"
    binary.mkdir()
    (binary / "results.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    return {"tmp": tmp}


# (label, argv with {tmp} for the test's directory, text the one sentence must hold)
ROWS = [
    ("missing cache", ["inspect", "{tmp}/nothing.safetensors"], "no such file"),
    ("cache is a directory", ["inspect", "{tmp}/adir"], "no such cache file"),
    ("cache is noise", ["inspect", "{tmp}/noise.safetensors"], "not a readable safetensors file"),
    (
        "--out in a missing directory",
        ["compress", str(TRANSCRIPT), *MODEL, "--out", "{tmp}/missing/c.safetensors"],
        "--out",
    ),
    ("--out is a directory", ["compress", str(TRANSCRIPT), *MODEL, "--out", "{tmp}/adir"], "--out"),
    (
        "--json in a missing directory",
        ["compress", str(TRANSCRIPT), *MODEL, "--out", "{tmp}/existing.safetensors", "--json", "{tmp}/no/s.json"],
        "--json",
    ),
    ("--ratio inf", ["compress", str(TRANSCRIPT), *MODEL, "--ratio", "inf", "--out", "{tmp}/c.safetensors"], "--ratio"),
    ("--ratio nan", ["compress", str(TRANSCRIPT), *MODEL, "--ratio", "nan", "--out", "{tmp}/c.safetensors"], "--ratio"),
    (
        "--ratio below 1",
        ["compress", str(TRANSCRIPT), *MODEL, "--ratio", "0.5", "--out", "{tmp}/c.safetensors"],
        "--ratio",
    ),
    ("--window 0", ["compress", str(TRANSCRIPT), *MODEL, "--window", "0", "--out", "{tmp}/c.safetensors"], "--window"),
    (
        "misspelled model alias",
        ["compress", str(TRANSCRIPT), "--model", "smollm2-135", "--out", "{tmp}/existing.safetensors"],
        "unknown model 'smollm2-135'",
    ),
    ("eval --ratio below 1", ["eval", str(TRANSCRIPT), *MODEL, "--method", "knorm", "--ratio", "0.5"], "--ratio"),
    (
        "eval --json is a directory",
        ["eval", str(TRANSCRIPT), *MODEL, "--method", "knorm", "--json", "{tmp}/adir"],
        "--json",
    ),
    (
        "ask --max-new-tokens -5",
        ["ask", "{tmp}/existing.safetensors", "--question", "q", "--max-new-tokens", "-5"],
        "--max-new-tokens",
    ),
    ("chat --temperature -1", ["chat", str(TRANSCRIPT), *MODEL, "--temperature", "-1"], "--temperature"),
    ("chat --compress-every -2", ["chat", str(TRANSCRIPT), *MODEL, "--compress-every", "-2"], "--compress-every"),
    (
        "render --json in a missing directory",
        ["render", str(TRANSCRIPT), "--model", "smollm2-135m", "--json", "{tmp}/no/r.json"],
        "--json",
    ),
    ("a question with choices: []", ["validate", "{tmp}/empty-choices.json"], "choices"),
    ("report on another schema", ["report", "{tmp}/other-schema"], "field"),
    ("report on binary bytes", ["report", "{tmp}/binary"], "no finished runs"),
]


@pytest.mark.parametrize("label, argv, needle", ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_gets_one_sentence_and_changes_nothing(tmp_path, capsys, label, argv, needle):
    prepare(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    try:
        code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    except SystemExit as exit_:  # argparse refuses a flag's value with its own one-line message
        code = exit_.code
    out = capsys.readouterr()
    assert code not in (0, None), label
    assert "Traceback" not in out.err + out.out
    if argv[0] == "validate":  # a report of every problem found, on stdout
        assert needle in out.out.replace("\n", " ") and "problem" in out.out, (label, out.out)
    else:
        assert needle in out.err.replace("\n", " "), (label, out.err)
        assert len([line for line in out.err.splitlines() if "error" in line]) == 1, (label, out.err)
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before, f"{label}: changed {sorted(set(after) ^ set(before)) or 'a file'}"


def test_a_ratio_above_the_span_length_is_refused_not_clamped(tmp_path, capsys, monkeypatch):
    def never(args):
        raise AssertionError("the model was loaded before the ratio was checked")

    monkeypatch.setattr("vkv.cli.compress.load_model_from", never)
    code = main(["compress", str(TRANSCRIPT), *MODEL, "--ratio", "1e9", "--out", str(tmp_path / "c.safetensors")])
    err = capsys.readouterr().err.replace("\n", " ")
    assert code == 2 and "field ratio" in err and "Traceback" not in err
    assert not (tmp_path / "c.safetensors").exists()


def test_a_truncated_model_is_one_sentence(tiny_lamr_checkpoint, tmp_path, capsys):
    """A model directory whose weights were cut short (the tiny backbone saved beside the LaMR checkpoint)."""
    import shutil

    backbone = tmp_path / "model"
    shutil.copytree(Path(tiny_lamr_checkpoint).parent / "backbone", backbone)
    weights = backbone / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    code = main(["doctor", "--model", str(backbone), "--quant", "fp32"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and str(backbone) in err.replace("\n", "")


def test_a_moved_transcript_is_named_with_the_way_out(tmp_path, capsys, test_model_dir):
    """A cache records its transcript's resolved path; when it has moved, ask says to pass --transcript."""
    from vkv.kv.file import read_header

    moved = tmp_path / "t.json"
    moved.write_text(TRANSCRIPT.read_text())
    cache = tmp_path / "c.safetensors"
    code = main(
        ["compress", str(moved), *MODEL, "--method", "vkv", "--ratio", "4", "--steps", "1", "--out", str(cache)]
    )
    assert code == 0 and read_header(cache)["transcript"]["path"] == str(moved.resolve())
    moved.rename(tmp_path / "elsewhere.json")
    capsys.readouterr()
    assert main(["ask", str(cache), "--question", "Which library?"]) == 2
    err = capsys.readouterr().err.replace("\n", " ")
    assert "--transcript" in err and "transcript.path" in err
    assert (
        main(["ask", str(cache), "--question", "Which library?", "--transcript", str(tmp_path / "elsewhere.json")]) == 0
    )


def test_eval_refuses_a_ratio_the_window_cannot_take_before_any_prefill(capsys, monkeypatch):
    import vkv.evals.runner as runner

    def never(*args, **kwargs):
        raise AssertionError("the references were prefilled before the ratio was checked")

    monkeypatch.setattr(runner.TranscriptEval, "__init__", never)
    assert main(["eval", str(TRANSCRIPT), *MODEL, "--method", "knorm", "--ratio", "1e9"]) == 2
    assert "field ratio" in capsys.readouterr().err


def test_a_prefill_that_would_not_fit_is_refused_before_it_starts(smol, monkeypatch):
    from vkv.errors import VkvError
    from vkv.kv.spliced import SplicedCache
    from vkv.lm import frozen
    from vkv.lm.context import Context

    monkeypatch.setattr(frozen, "free_memory", lambda device: 50 * 2**20)  # a machine with 50 MiB free
    with pytest.raises(VkvError, match=r"2000 tokens at once needs about .* GiB, more than the 0.0 GiB free"):
        Context(smol, SplicedCache()).feed(list(range(100, 2100)))


@pytest.mark.integration
def test_a_prefill_stays_within_its_estimate(smol):
    """What `check_prefill` refuses on is an upper bound of what a feed takes (peak RSS above what was held)."""
    from vkv.kv.spliced import SplicedCache
    from vkv.lm.context import Context
    from vkv.lm.spec import prefill_bytes
    from vkv.tools.measure import working_memory

    Context(smol, SplicedCache()).feed(list(range(100, 400)))  # one-time allocations first
    n = 2048
    with working_memory(smol.device) as peak:
        Context(smol, SplicedCache()).feed(list(range(100, 100 + n)))
    estimate = prefill_bytes(smol.spec, smol.config.intermediate_size, n, n, 4, 4) / 2**20
    assert peak["mb"] is not None and 0 < peak["mb"] <= estimate
