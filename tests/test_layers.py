"""The package's layers: data flows one way, so a layer imports only the layers above it (imports inside functions
and under TYPE_CHECKING count too). `kv/`, at the bottom, holds tensors and shapes and imports no model code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "vkv"
LAYERS = ["kv", "lm", "text", "compress", "backends", "methods", "api", "evals", "sweep", "tools", "cli"]


def vkv_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vkv."):
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names if alias.name.startswith("vkv.")]
    return names


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_the_layers_above_it(layer):
    below = set(LAYERS[LAYERS.index(layer) + 1 :])
    upward = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for name in vkv_imports(path)
        if name.split(".")[1] in below
    ]
    assert not upward, "; ".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from vkv.lm.frozen import FrozenLM\n")
    assert vkv_imports(module) == ["vkv.lm.frozen"]


MAX_FILE_LINES, MAX_FUNCTION_LINES = (
    600,
    80,
)  # past these a file holds more than one idea, a function more than one step


def oversized(path: Path) -> list[str]:
    source = path.read_text(encoding="utf-8")
    found = [f"{path.name}: {source.count(chr(10))} lines"] if source.count("\n") > MAX_FILE_LINES else []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{path.name}: {node.name} is {length} lines")
    return found


def test_no_file_or_function_outgrows_one_idea():
    found = [item for path in sorted(PACKAGE.rglob("*.py")) for item in oversized(path)]
    assert not found, "; ".join(found)


def test_the_size_check_sees_a_long_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES)
    assert oversized(module) == [f"m.py: f is {MAX_FUNCTION_LINES + 1} lines"]
