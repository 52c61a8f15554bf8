"""The README's Python example runs as written."""

import re

import pytest

from tests.conftest import ROOT


@pytest.mark.integration
def test_the_readme_python_example_runs(test_model_dir, tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    match = re.search(r"<!-- python-api -->\n```python\n(.*?)```", text, re.S)
    assert match, "README.md lost its <!-- python-api --> example"
    monkeypatch.chdir(tmp_path)
    printed = []
    exec(compile(match.group(1), "README.md", "exec"), {"print": lambda *a: printed.append(" ".join(map(str, a)))})
    assert len(printed) == 5 and re.fullmatch(r"\d+ bytes to decode on, for \d+ tokens", printed[0])
    nbytes, tokens = map(int, re.findall(r"\d+", printed[0]))
    layers, heads, dim = 30, 3, 64  # smollm2-135m: what the uncompressed conversation's K/V take in fp32
    assert nbytes < tokens * layers * heads * 2 * dim * 4 / 2 and (tmp_path / "session.safetensors").is_file()
    assert printed[1] == printed[3]  # the saved and loaded session answer alike
    assert printed[4].strip()  # transformers' generate() on the loaded RaggedCache answers
