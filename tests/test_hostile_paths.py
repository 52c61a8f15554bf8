"""Hostile paths: every command's path arguments given /dev/zero, a directory, a FIFO, deeply nested JSON, invalid
UTF-8 or a model directory holding only config.json get exit code 2 and one sentence, quickly and in bounded memory;
an output that is one of the command's inputs, or a file of another kind, is refused before any work and left as it
was. (Cache files given as inputs have their own test, test_cache_mutations.py.)"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from vkv.cli import main

TRANSCRIPT = FIXTURES / "mini-agent.json"
MODEL = ["--model", "smollm2-135m", "--quant", "fp32"]
DEEP = "[" * 100_000 + "]" * 100_000


def bad_paths(tmp: Path) -> dict[str, Path]:
    """One path of each hostile kind (the FIFO has no writer: a read that waits for one would hang the test)."""
    (tmp / "adir").mkdir()
    os.mkfifo(tmp / "fifo")
    (tmp / "deep.json").write_text(DEEP)
    nested = json.loads(TRANSCRIPT.read_text())  # a valid transcript but for one deeply nested tool argument
    deep_args: dict = {}
    for _ in range(500):
        deep_args = {"x": deep_args}
    nested["messages"][2]["tool_calls"] = [{"name": "bash", "arguments": deep_args}]
    (tmp / "nested-args.json").write_text(json.dumps(nested))
    (tmp / "latin1.json").write_bytes(TRANSCRIPT.read_bytes().replace(b"bcrypt", b"bcr\xffpt"))
    return {
        "dev-zero": Path("/dev/zero"),
        "directory": tmp / "adir",
        "fifo": tmp / "fifo",
        "deep-json": tmp / "deep.json",
        "nested-args": tmp / "nested-args.json",
        "invalid-utf8": tmp / "latin1.json",
    }


# (command label, argv with {path} for the hostile path and {tmp} for the test's directory)
COMMANDS = [
    ("render", ["render", "{path}", "--model", "smollm2-135m"]),
    ("compress", ["compress", "{path}", *MODEL, "--out", "{tmp}/c.safetensors"]),
    ("eval", ["eval", "{path}", *MODEL, "--method", "knorm", "--ratio", "2"]),
    ("import", ["import", "{path}", "--out", "{tmp}/t.json"]),
    ("chat", ["chat", "{path}", *MODEL]),
    ("prune", ["prune", "{path}", "--backend", "longcodezip", "--query", "q", "--ratio", "2", *MODEL]),
    ("sweep", ["sweep", "{path}", "--out", "{tmp}/sweep"]),
]
KINDS = ["dev-zero", "directory", "fifo", "deep-json", "nested-args", "invalid-utf8"]
NOT_JSON = {"prune", "sweep"}  # they read source code and TOML: nested JSON is plain text to them


def run_bounded(argv: list[str], capsys) -> tuple[int, str]:
    """The exit code and stderr of `vkv argv`, checked to take under a minute and under 1 GB more peak memory."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    start = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    elapsed = time.perf_counter() - start
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out, argv
    assert elapsed < 60, f"{argv}: took {elapsed:.0f} s"
    assert grown < 2**20, f"{argv}: peak memory grew by {grown / 2**20:.1f} GB"
    return code, out.err


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("label, argv", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_hostile_path_argument_is_one_sentence(tmp_path, capsys, monkeypatch, label, argv, kind):
    if kind in ("deep-json", "nested-args") and label in NOT_JSON:
        pytest.skip(f"{label} reads no JSON")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # chat, should it start, reads no question
    path = bad_paths(tmp_path)[kind]
    code, err = run_bounded([a.replace("{path}", str(path)).replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2, (label, kind, err)
    assert len(err.strip().splitlines()) <= 3 and err.count("error:") == 1, (label, kind, err)  # one wrapped line
    assert path.name in err.replace("\n", ""), (label, kind, err)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "deep-json", "invalid-utf8"])
def test_a_hostile_results_file_is_skipped_or_refused(tmp_path, capsys, kind):
    """`vkv report DIR` with a results file that is a FIFO or device (refused) or noise (skipped, then no runs)."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    results = sweep / "results.jsonl"
    if kind == "dev-zero":
        results.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(results)
    elif kind == "deep-json":
        results.write_text(DEEP + "\n")
    else:
        results.write_bytes(b'{"run_id": "\xff"}\n')
    code, err = run_bounded(["report", str(sweep)], capsys)
    assert code == 2 and err.count("error:") == 1, err


def test_a_results_file_that_is_not_regular_is_refused_by_the_writer(tmp_path):
    from vkv.errors import VkvError
    from vkv.sweep.results import ResultsFile

    os.mkfifo(tmp_path / "results.jsonl")
    with pytest.raises(VkvError, match="not a regular file"):
        ResultsFile(tmp_path / "results.jsonl")


def test_an_oversized_input_names_the_limit_and_how_to_raise_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VKV_MAX_INPUT_MB", "0.001")  # 1 kB; the fixture is larger
    code, err = run_bounded(["render", str(TRANSCRIPT), "--model", "smollm2-135m"], capsys)
    err = err.replace("\n", " ")
    assert code == 2 and "limit of 0.001 MB" in err and "VKV_MAX_INPUT_MB" in err
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * 200_000)  # 1.2 MB
    monkeypatch.setenv("VKV_MAX_SOURCE_MB", "1")
    argv = ["prune", str(big), "--backend", "longcodezip", "--query", "q", "--ratio", "2", *MODEL]
    code, err = run_bounded(argv, capsys)
    assert code == 2 and "VKV_MAX_SOURCE_MB" in err.replace("\n", " ")


def test_a_model_directory_with_only_its_config_is_one_sentence(tmp_path, capsys, test_model_dir):
    only_config = tmp_path / "model"
    only_config.mkdir()
    shutil.copy(test_model_dir / "config.json", only_config)
    for argv in (
        ["render", str(TRANSCRIPT), "--model", str(only_config)],
        ["compress", str(TRANSCRIPT), "--model", str(only_config), "--out", str(tmp_path / "c.safetensors")],
        ["doctor", "--model", str(only_config), "--quant", "fp32"],
    ):
        code, err = run_bounded(argv, capsys)
        assert code == 2 and "no tokenizer" in err and err.count("error:") == 1, (argv, err)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # a tokenizer but no weights
        shutil.copy(test_model_dir / name, only_config)
    code, err = run_bounded(["doctor", "--model", str(only_config), "--quant", "fp32"], capsys)
    assert code == 2 and "no weights" in err, err


# ---- outputs onto inputs ------------------------------------------------------------------------------------------


def outputs_setup(tmp: Path) -> dict[str, Path]:
    transcript = tmp / "t.json"
    transcript.write_bytes(TRANSCRIPT.read_bytes())
    (tmp / "notes.txt").write_text("my notes\n")
    (tmp / "c.safetensors").write_bytes((2).to_bytes(8, "little") + b"{}" + b"\0" * 16)  # a (tiny) safetensors file
    openai = tmp / "openai.json"
    openai.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]))
    return {"transcript": transcript}


# (label, argv, text the sentence must hold); {tmp} is the test's directory, {model} the test model's
ONTO_INPUTS = [
    ("compress --out onto its transcript", ["compress", "{tmp}/t.json", *MODEL, "--out", "{tmp}/t.json"], "transcript"),
    (
        "compress --json onto its transcript",
        ["compress", "{tmp}/t.json", *MODEL, "--out", "{tmp}/new.safetensors", "--json", "{tmp}/./t.json"],
        "transcript",
    ),
    (
        "render --json onto its transcript",
        ["render", "{tmp}/t.json", *MODEL[:2], "--json", "{tmp}/t.json"],
        "transcript",
    ),
    (
        "eval --json onto its transcript",
        ["eval", "{tmp}/t.json", *MODEL, "--method", "knorm", "--json", "{tmp}/t.json"],
        "transcript",
    ),
    ("import --out onto its file", ["import", "{tmp}/openai.json", "--out", "{tmp}/openai.json"], "input file"),
    (
        "ask --json onto its cache",
        ["ask", "{tmp}/c.safetensors", "--question", "q", "--json", "{tmp}/c.safetensors"],
        "cache",
    ),
    (
        "render --json into the model",
        ["render", "{tmp}/t.json", "--model", "{model}", "--json", "{model}/x.json"],
        "model directory",
    ),
    ("compress --out over a text file", ["compress", "{tmp}/t.json", *MODEL, "--out", "{tmp}/notes.txt"], "--force"),
    ("render --json over a cache", ["render", "{tmp}/t.json", *MODEL[:2], "--json", "{tmp}/c.safetensors"], "--force"),
    ("render --json over a text file", ["render", "{tmp}/t.json", *MODEL[:2], "--json", "{tmp}/notes.txt"], "--force"),
]


@pytest.mark.parametrize("label, argv, needle", ONTO_INPUTS, ids=[r[0] for r in ONTO_INPUTS])
def test_an_output_onto_an_input_or_a_foreign_file_is_refused_before_any_work(
    tmp_path, capsys, monkeypatch, test_model_dir, label, argv, needle
):
    outputs_setup(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    model_before = sorted(test_model_dir.iterdir())
    code, err = run_bounded(
        [a.replace("{tmp}", str(tmp_path)).replace("{model}", str(test_model_dir)) for a in argv], capsys
    )
    err = err.replace("\n", "")
    assert code == 2 and needle in err and err.count("error:") == 1, (label, err)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before, label
    assert sorted(test_model_dir.iterdir()) == model_before


def test_force_replaces_a_file_of_another_kind(tmp_path, capsys):
    outputs_setup(tmp_path)
    code = main(
        [
            "render",
            str(tmp_path / "t.json"),
            "--model",
            "smollm2-135m",
            "--json",
            str(tmp_path / "notes.txt"),
            "--force",
        ]
    )
    assert code == 0 and json.loads((tmp_path / "notes.txt").read_text())["tokens"] > 0
    code = main(["render", str(tmp_path / "t.json"), "--model", "smollm2-135m", "--json", str(tmp_path / "notes.txt")])
    assert code == 0, "JSON over JSON (an earlier output) needs no --force"


@pytest.mark.integration
def test_chat_save_refuses_its_source_and_a_foreign_file(smol, tmp_path, capsys, monkeypatch):
    outputs_setup(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    lines = [f"/save {tmp_path / 't.json'}", f"/save {tmp_path / 'notes.txt'}"]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    code = main(["chat", str(tmp_path / "t.json"), *MODEL, "--method", "vkv", "--max-new-tokens", "4", "--steps", "1"])
    out = capsys.readouterr().out.replace("\n", " ")
    assert code == 0 and out.count("not saved") == 2, out
    assert "the chat's source" in out and "a text file" in out
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


# ---- rendering is linear -----------------------------------------------------------------------------------------


def synthetic(n: int):
    from vkv.text.transcript import parse_transcript

    messages = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(n - 1):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"Step {i}: edited src/file{i}.py; pytest: {i} passed."})
    return parse_transcript({"id": "synthetic", "messages": messages})


def test_a_long_transcript_renders_in_seconds_with_the_spans_of_the_exact_check(smol_tokenizer):
    from vkv.text.transcript import ChatFormat, _render_by_prefixes, render

    fmt = ChatFormat(smol_tokenizer)
    start = time.perf_counter()
    rendered = render(synthetic(10_000), smol_tokenizer, fmt)
    assert time.perf_counter() - start < 30  # the prefix-by-prefix check took > 600 s
    assert len(rendered.spans) == 10_000 and rendered.spans[-1].end == len(rendered.ids)
    small = synthetic(60)
    exact = _render_by_prefixes(small, smol_tokenizer, fmt, [fmt.to_chat(m) for m in small.messages])
    fast = render(small, smol_tokenizer, fmt)
    assert (fast.ids, fast.spans, fast.text) == (exact.ids, exact.spans, exact.text)


def test_a_rendering_beyond_the_positions_is_refused_before_per_message_work(smol_tokenizer, monkeypatch):
    import vkv.text.transcript as transcript
    from vkv.errors import VkvError

    def never(*args):
        raise AssertionError("per-message work before the length check")

    monkeypatch.setattr(transcript, "_message_texts", never)
    with pytest.raises(VkvError, match="beyond the model's 1000 positions"):
        transcript.render(synthetic(200), smol_tokenizer, max_tokens=1000)


def test_a_template_that_looks_ahead_takes_the_exact_path(smol_tokenizer):
    """A template that closes a run of tool messages only after the last one (as Qwen2.5's groups them): message
    prefixes are not text prefixes, so the spans come from (and the refusal is) the exact check's."""
    from vkv.errors import VkvError
    from vkv.text.transcript import ChatFormat, parse_transcript, render

    class LookingAhead(ChatFormat):
        def render_text(self, chats, add_generation_prompt=False):
            parts = []
            for i, chat in enumerate(chats):
                parts.append(f"<{chat['role']}>{chat['content']}")
                if i + 1 == len(chats) or chats[i + 1]["role"] != chat["role"]:
                    parts.append("</end>\n")
            return "".join(parts)

    messages = [{"role": "user", "content": "run"}, {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    with pytest.raises(VkvError, match=r"messages\[2\].*token prefixes"):
        render(parse_transcript({"id": "t", "messages": messages}), smol_tokenizer, LookingAhead(smol_tokenizer))


def test_plan_with_a_huge_window_answers(capsys):
    from vkv.tools.memory import load_config, worst_span

    start = time.perf_counter()
    worst = worst_span(load_config("smollm2-135m"), window=10**12, quant="fp32", device="cpu")
    assert time.perf_counter() - start < 30 and 0 < worst.span <= 10**12


@pytest.mark.parametrize(("model", "positions"), [("smollm2-135m", 8192), ("meta-llama/Llama-3.1-8B-Instruct", 131072)])
def test_vkv_plan_refuses_a_window_beyond_the_models_positions(tmp_path, capsys, model, positions):
    from vkv.cli import main

    out = tmp_path / "plan.json"
    argv = ["plan", "--model", model, "--quant", "fp32", "--device", "cpu", "--json", str(out)]
    assert main([*argv, "--window", str(10**12)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--window {10**12}: beyond the {positions} positions of {model}" in err and not out.exists()
    assert main([*argv, "--window", str(positions), "--span", "4096"]) in (0, 1)  # the longest window still plans
    assert out.exists()


@pytest.fixture
def positions(monkeypatch):
    """Set how many positions every model loaded here has (the test model's 8192 need long inputs to exceed)."""
    from vkv.lm.frozen import FrozenLM

    def set_to(n: int) -> None:
        monkeypatch.setattr(FrozenLM, "max_positions", property(lambda self: n))

    return set_to


@pytest.mark.parametrize(
    ("flags", "hint"),
    [([], "; use a window of it (--window)"), (["--window", "300"], "; the window itself is too long for this model")],
)
def test_a_text_beyond_the_models_positions_names_window_only_where_it_helps(positions, capsys, flags, hint):
    from vkv.cli import main

    positions(64)
    argv = ["eval", str(FIXTURES / "mini-agent.json"), "--model", "smollm2-135m", "--quant", "fp32"]
    assert main([*argv, "--method", "truncate", *flags]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "64 positions" in err and hint in err
    assert ("give a --window below 300" in err) == bool(flags)


def test_ask_beyond_the_models_positions_names_what_ask_offers_not_window(positions, tmp_path, capsys):
    from vkv.cli import main
    from vkv.kv.file import trusted_header

    cache = tmp_path / "kv.safetensors"
    model = ["--model", "smollm2-135m", "--quant", "fp32"]
    assert (
        main(["compress", str(FIXTURES / "mini-agent.json"), *model, "--method", "truncate", "--out", str(cache)]) == 0
    )
    positions(trusted_header(cache, False)["next_position"] + 2)  # the cache fits, a question after it does not
    assert main(["ask", str(cache), "--question", "Which CI job failed?", "--max-new-tokens", "2"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "positions of" in err and "ask a shorter question" in err and "--window" not in err
