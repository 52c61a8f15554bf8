"""Rubric labels: semantic = kept × score; dependency along AST edges with decay; denoised = union."""

import pytest

from vkv.backends.lamr.labels import LabelConfig, rubric_labels
from vkv.backends.source.treesitter import grammar_installed

CODE = """import json
import os
import re

PATTERN = re.compile("x")


def load(path):
    with open(path) as handle:
        return json.load(handle)


class Config:
    def read(self, path):
        try:
            data = load(path)
        except OSError:
            data = {}
        else:
            data["ok"] = True
        finally:
            pass
        return data

    def match(self, text):
        return PATTERN.match(text)


def main():
    return Config().read("a")
"""
LINES = CODE.splitlines()


def line(fragment: str) -> int:
    return next(i for i, text in enumerate(LINES) if fragment in text)


def dependency_lines(labels) -> set[str]:
    return {LINES[i].strip() for i, d in enumerate(labels.dependency) if d}


def test_semantic_is_kept_lines_times_score():
    kept = [line("data = load(path)")]
    high = rubric_labels(CODE, kept, 0.9)
    assert high.semantic_score[kept[0]] == 0.9 and high.semantic[kept[0]] == 1 and sum(high.semantic) == 1
    low = rubric_labels(CODE, kept, 0.3)
    assert low.teacher[kept[0]] == 1 and low.semantic[kept[0]] == 0  # teacher kept it, but the document score is low


def test_dependency_follows_structure_definitions_and_companions():
    labels = rubric_labels(CODE, [line("data = load(path)")], 1.0)
    deps = dependency_lines(labels)
    # enclosing scope headers and control-flow companions (structural, no decay)
    assert {"class Config:", "def read(self, path):", "try:", "except OSError:", "else:", "finally:"} <= deps
    # one symbol hop: the definition of `load`
    assert "def load(path):" in deps
    # two hops (json is used inside load's body, not by the kept line): decayed below the threshold
    assert "import json" not in deps and "import os" not in deps
    assert labels.dependency_score[line("def load(path):")] == 0.5
    assert labels.analysis == "python-ast"


def test_imports_call_sites_and_denoised_union():
    labels = rubric_labels(CODE, [line("return json.load(handle)")], 1.0)
    deps = dependency_lines(labels)
    assert "import json" in deps and "import re" not in deps
    assert {"def load(path):", "with open(path) as handle:"} <= deps
    assert labels.denoised == [max(t, d) for t, d in zip(labels.teacher, labels.dependency)]
    calls = rubric_labels(CODE, list(range(line("def load(path):"), line("return json.load") + 1)), 1.0)
    assert "data = load(path)" in dependency_lines(calls)  # a call site of the kept function
    no_calls = rubric_labels(
        CODE,
        list(range(line("def load(path):"), line("return json.load") + 1)),
        1.0,
        config=LabelConfig(call_sites=False),
    )
    assert "data = load(path)" not in dependency_lines(no_calls)


def test_slower_decay_reaches_further():
    kept = [line("return PATTERN.match(text)")]
    near = rubric_labels(CODE, kept, 1.0)
    assert 'PATTERN = re.compile("x")' in dependency_lines(near) and "import re" not in dependency_lines(near)
    far = rubric_labels(CODE, kept, 1.0, config=LabelConfig(decay=0.8, dependency_threshold=0.6))
    assert "import re" in dependency_lines(far)  # two symbol hops: 0.64 ≥ 0.6


def test_negative_and_unparseable_records():
    empty = rubric_labels(CODE, [], 0.0)
    assert not any(empty.teacher) and not any(empty.dependency) and not any(empty.denoised)
    broken = rubric_labels("def f(:\n  pass\n", [0], 1.0)
    assert broken.analysis == "none" and broken.denoised == broken.teacher
    text = rubric_labels("just words\nmore words\n", [1], 1.0, language="prose")
    assert text.analysis == "none" and text.denoised == [0, 1]


@pytest.mark.skipif(not grammar_installed("javascript"), reason="tree-sitter-javascript not installed")
def test_tree_sitter_dependency_for_javascript():
    js = 'import { readFile } from "fs";\nimport path from "path";\n\nfunction load(name) {\n  if (name) {\n    return readFile(name);\n  }\n  return null;\n}\n'
    labels = rubric_labels(js, [5], 1.0, language="javascript")
    assert labels.analysis == "tree-sitter:javascript"
    deps = {i for i, d in enumerate(labels.dependency) if d}
    assert {3, 4, 6, 8, 0} <= deps and 1 not in deps  # headers, closing braces, the readFile import
