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
    assert len(printed) == 4 and re.fullmatch(r"\d+ cache entries for \d+ tokens", printed[0])
    entries, tokens = map(int, re.findall(r"\d+", printed[0]))
    assert entries < tokens and (tmp_path / "session.safetensors").is_file()
    assert printed[1] == printed[3]  # the saved and loaded session answer alike
