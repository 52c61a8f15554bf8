"""The README's examples run as written."""

import re
import shlex

import pytest

from tests.conftest import ROOT


@pytest.mark.integration
def test_the_readme_python_example_runs(test_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    printed = []
    exec(
        compile(readme_block("python-api", "python"), "README.md", "exec"),
        {"print": lambda *a: printed.append(" ".join(map(str, a)))},
    )
    assert len(printed) == 5 and re.fullmatch(r"\d+ bytes to decode on, for \d+ tokens", printed[0])
    nbytes, tokens = map(int, re.findall(r"\d+", printed[0]))
    layers, heads, dim = 30, 3, 64  # smollm2-135m: what the uncompressed conversation's K/V take in fp32
    assert nbytes < tokens * layers * heads * 2 * dim * 4 and (tmp_path / "session.safetensors").is_file()
    assert printed[1] == printed[3]  # the saved and loaded session answer alike
    # the answers name the library the compressed messages hold: vkv's greedy loop before and after save/load, and
    # transformers' generate() on the loaded RaggedCache (at 4x, too much for messages of 9-29 tokens, the first
    # answered "npm test: 14 passed")
    assert all("bcrypt" in printed[i].lower() for i in (1, 3, 4)), printed


def readme_block(marker: str, language: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- {marker} -->\n```{language}\n(.*?)```", text, re.S)
    assert match, f"README.md lost its <!-- {marker} --> block"
    return match.group(1)


def test_the_readme_is_a_guide_with_both_quickstarts_on_its_first_screens():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    assert all(any(f"<!-- {m} -->" in line for line in lines[:60]) for m in ("cli-quickstart", "python-api"))


@pytest.mark.integration
def test_the_readme_command_line_quickstart_runs_as_written(test_model_dir, tmp_path, monkeypatch, capsys):
    from vkv.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "transcripts").symlink_to(ROOT / "transcripts")
    for line in readme_block("cli-quickstart", "bash").strip().splitlines():
        words = shlex.split(line, comments=True)  # each line ends with its time as a comment
        assert words[0] == "vkv" and re.search(r"  # \d+ s$", line), line
        assert main(words[1:]) == 0, line
        if words[1] == "compress":  # its seconds say what they count, the model's load apart
            said = " ".join(capsys.readouterr().out.split())  # the console may wrap the line
            assert re.search(r"\(\d+\.\d s wall, from the prefill to the written file\); the model loaded in", said)
        if words[1] == "ask":
            # the compressed window holds the fact asked about: "bcryptjs" (turns 1-3 hold neither; turns 4-6 only the
            # bcrypt the project later drops, which the answer then names)
            answers = re.findall(r"^A: (.*)$", capsys.readouterr().out, re.M)
            assert len(answers) == 1 and "bcryptjs" in answers[0], answers
    printed = capsys.readouterr().out
    assert (tmp_path / "taskapi.safetensors").is_file() and "kvzip" in printed


@pytest.mark.integration
def test_the_readme_plain_transformers_example_runs(test_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    printed = []
    exec(compile(readme_block("python-compress", "python"), "README.md", "exec"), {"print": printed.append})
    assert len(printed) == 1 and "bcrypt" in printed[0].lower()  # an answer read from the compressed cache
