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
