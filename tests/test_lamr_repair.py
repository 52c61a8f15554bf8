"""AST-aware repair: each rule, placeholders, emptied blocks, and the promise that Python output parses."""

import ast
import random
import sysconfig
from pathlib import Path

import pytest

from vkv.backends.lamr.repair import RepairConfig, render_selection, repair
from vkv.backends.source.lines import split_lines
from vkv.backends.source.treesitter import grammar_installed

SOURCE = '''import os
import sys
from collections import OrderedDict

TIMEOUT = 30


def helper(value):
    return value * 2


class Store:
    """Keeps things."""

    @property
    def size(self):
        return len(self.items)

    def load(self, path):
        data = open(
            path,
            "rb",
        ).read()
        try:
            parsed = helper(len(data))
        except ValueError:
            parsed = 0
        finally:
            os.sync()
        if parsed > TIMEOUT:
            note = """long
text"""
        elif parsed:
            note = "short"
        else:
            note = ""
        return parsed, note
'''
LINES = SOURCE.splitlines()


def line(fragment: str) -> int:
    """0-based index of the first line containing `fragment`."""
    return next(i for i, text in enumerate(LINES) if fragment in text)


NONE = RepairConfig(control_flow=False, imports=False, definitions=False, returns=False)


def kept_text(result) -> set[str]:
    return {LINES[i].strip() for i in result.kept}


def test_closure_keeps_whole_statements_and_strings():
    result = repair(SOURCE, [line('"rb",'), line('text"""')], "python", NONE)
    assert {"data = open(", "path,", '"rb",', ").read()"} <= kept_text(result)
    assert {'note = """long', 'text"""'} <= kept_text(result)
    assert line("data = open(") in result.added["closure"]
    ast.parse(result.text)


def test_enclosing_headers_include_class_def_and_decorators():
    result = repair(SOURCE, [line("return len(self.items)")], "python", NONE)
    assert {"class Store:", "@property", "def size(self):"} <= kept_text(result)
    assert set(result.added["enclosing"]) >= {line("class Store:"), line("def size(self):"), line("@property")}
    ast.parse(result.text)


def test_required_clause_keeps_try_valid():
    result = repair(SOURCE, [line("os.sync()")], "python", NONE)  # only the finally body
    assert {"try:", "finally:"} <= kept_text(result)
    ast.parse(result.text)
    result = repair(SOURCE, [line("parsed = helper(")], "python", NONE)  # only the try body
    assert "except ValueError:" in kept_text(result)
    assert line("except ValueError:") in result.added["required"]
    ast.parse(result.text)


def test_control_flow_companions():
    result = repair(
        SOURCE, [line('note = "short"')], "python", RepairConfig(imports=False, definitions=False, returns=False)
    )
    assert {"if parsed > TIMEOUT:", "elif parsed:", "else:"} <= kept_text(result)
    assert line("else:") in result.added["control_flow"]
    ast.parse(result.text)
    without = repair(SOURCE, [line('note = "short"')], "python", NONE)
    assert "else:" not in kept_text(without)


def test_referenced_imports():
    result = repair(
        SOURCE, [line("os.sync()")], "python", RepairConfig(control_flow=False, definitions=False, returns=False)
    )
    assert "import os" in kept_text(result) and "import sys" not in kept_text(result)
    assert result.added["imports"] == [line("import os")]
    assert "import os" not in kept_text(repair(SOURCE, [line("os.sync()")], "python", NONE))


def test_referenced_definitions_get_header_and_ellipsis():
    config = RepairConfig(control_flow=False, imports=False, returns=False)
    result = repair(SOURCE, [line("parsed = helper("), line("if parsed > TIMEOUT:")], "python", config)
    assert {"def helper(value):", "TIMEOUT = 30"} <= kept_text(result)
    assert "return value * 2" not in kept_text(result)
    assert "def helper(value):\n    ...  # ... 3 lines omitted" in result.text  # body + 2 blank lines
    ast.parse(result.text)


def test_selected_return_lines():
    config = RepairConfig(control_flow=False, imports=False, definitions=False)
    result = repair(SOURCE, [line("parsed = 0")], "python", config)
    assert "return parsed, note" in kept_text(result)
    assert result.added["returns"] == [line("return parsed, note")]


def test_placeholders_and_emptied_blocks():
    result = repair(SOURCE, [line("class Store:")], "python", NONE)
    assert result.fillers == {line("class Store:"): "    "}
    rest = len(LINES) - line("class Store:") - 1
    assert f"class Store:\n    ...  # ... {rest} lines omitted" in result.text
    assert result.text.startswith("# ... 11 lines omitted\n")
    ast.parse(result.text)
    nothing = repair(SOURCE, [], "python")
    assert nothing.text == f"# ... {len(LINES)} lines omitted\n" and nothing.kept == []


def test_without_repair_only_placeholders():
    raw = render_selection(SOURCE, [line("return value * 2")], "python")
    assert raw.kept == [line("return value * 2")] and raw.method == "none"
    assert "    return value * 2" in raw.text and "def helper" not in raw.text


def test_unparseable_python_is_rendered_without_repair():
    broken = "def f(:\n    x = 1\n    return x\n"
    result = repair(broken, [1], "python")
    assert result.method == "none" and result.kept == [1]


def _stdlib_files(count: int, seed: int) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py"))
    random.Random(seed).shuffle(files)
    return files[:count]


def test_python_output_always_parses_on_random_selections():
    rng = random.Random(0)
    checked = 0
    for path in _stdlib_files(25, 0):
        text = path.read_text(encoding="utf-8")
        n = len(split_lines(text))
        for density in (0.02, 0.1, 0.4, 0.8):
            keep = {i for i in range(n) if rng.random() < density}
            config = RepairConfig(*(rng.random() < 0.5 for _ in range(4)))
            result = repair(text, keep, "python", config)
            try:
                ast.parse(result.text)
            except SyntaxError as exc:  # pragma: no cover - the message is the useful part
                pytest.fail(f"{path.name} density {density}: {exc}")
            assert set(keep) <= set(result.kept)
            checked += 1
    assert checked == 100


@pytest.mark.skipif(not grammar_installed("go"), reason="tree-sitter-go not installed")
def test_tree_sitter_repair_closes_blocks_and_imports():
    import tree_sitter
    import tree_sitter_go

    go = 'package main\n\nimport (\n\t"fmt"\n\t"strings"\n)\n\nfunc f(x int) int {\n\tif x > 0 {\n\t\tfmt.Println(x)\n\t}\n\treturn 0\n}\n'
    result = repair(go, [9], "go")
    assert result.method == "tree-sitter:go"
    assert {7, 8, 10, 12, 2, 3, 5} <= set(result.kept)  # func/if headers, closing braces, import ( "fmt" )
    assert 4 not in result.kept and 11 not in result.kept  # "strings" is not referenced; return is unrelated
    assert "// ... " in result.text
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_go.language()))
    assert not parser.parse(result.text.encode()).root_node.has_error
