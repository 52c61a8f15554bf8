"""The demonstration checkpoint (scripts/train_lamr_demo.py) prunes real standard-library files into Python
that parses. Skipped until the script has been run on this machine."""

import ast
import sysconfig
from pathlib import Path

import pytest

from vkv.home import vkv_home

CHECKPOINT = vkv_home() / "lamr-demo" / "semantic-dependency"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not (CHECKPOINT / "lamr.json").is_file(), reason="run scripts/train_lamr_demo.py first"),
]


@pytest.mark.parametrize(
    "name, query",
    [
        ("shlex.py", "How does `quote` work?"),
        ("textwrap.py", "What does the function `dedent` return?"),
    ],
)
def test_demo_checkpoint_prunes_real_files_into_parsing_python(name, query):
    from vkv.backends.lamr.cli import prune_file

    path = Path(sysconfig.get_paths()["stdlib"]) / name
    result = prune_file(path, checkpoint=CHECKPOINT, query=query)
    ast.parse(result.text)
    assert result.compressed_tokens < result.original_tokens
    assert result.report["repair_method"] == "python-ast"
