"""The functions behind `vkv lamr build-corpus`, `vkv lamr train` and `vkv prune --backend lamr`."""

import ast
import json
from pathlib import Path

import pytest
import torch

from vkv.backends.lamr.checkpoint import read_manifest
from vkv.backends.lamr.cli import build_corpus_files, prune_file, train_from_files
from vkv.errors import VkvError

TOKENIZER = Path.home() / ".cache" / "vkv" / "models" / "smollm2-135m"
pytestmark = pytest.mark.skipif(
    not (TOKENIZER / "tokenizer.json").is_file(), reason="smollm2-135m tokenizer not fetched"
)

MODULE = '''"""A small module."""
import os
import re

WORD = re.compile(r"\\w+")


def words(text):
    """Words of a text."""
    return WORD.findall(text)


def count(text):
    total = 0
    for word in words(text):
        total += len(word)
    return total


class Reader:
    def __init__(self, path):
        self.path = path

    def read(self):
        with open(self.path) as handle:
            return handle.read()

    def size(self):
        return os.path.getsize(self.path)
'''


@pytest.fixture(scope="module")
def tiny_backbone(tmp_path_factory) -> str:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny-llama-cli")
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sources")
    for i in range(12):
        (root / f"module_{i}.py").write_text(MODULE.replace("Reader", f"Reader{i}").replace("count", f"count_{i}"))
    out = root / "corpus.jsonl"
    summary = build_corpus_files(
        out,
        val_out=root / "val.jsonl",
        sources=[root],
        records=12,
        val_records=4,
        val_fraction=0.25,
        min_lines=6,
        max_lines=20,
        per_file=2,
    )
    assert summary["train"]["records"] > 0 and summary["val"]["records"] > 0
    assert summary["train"]["source_files"] + summary["val"]["source_files"] == 12
    return out, root / "val.jsonl"


def test_build_corpus_writes_swe_pruner_records(corpus):
    train, val = corpus
    for path in (train, val):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            assert set(record) == {"query", "code", "kept_frags", "score"}


def test_train_then_prune_a_file(tiny_backbone, corpus, tmp_path):
    train, val = corpus
    out = tmp_path / "ckpt"
    summary = train_from_files(
        train,
        tiny_backbone,
        out,
        val_data=val,
        epochs=1,
        batch_size=4,
        lr=1e-3,
        trainable_top_layers=1,
        max_length=512,
        log=lambda _: None,
        show_progress=False,
    )
    assert summary.steps >= 1 and summary.history
    _, manifest = read_manifest(out)
    assert manifest["backbone_parameters"] and manifest["training"]["fused_target"] == "denoised"

    source = tmp_path / "module.py"
    source.write_text(MODULE)
    result = prune_file(source, checkpoint=out, query="How does `count` work?", threshold=0.4)
    ast.parse(result.text)
    assert result.report["mode"] == "threshold" and result.report["language"] == "python"
    budgeted = prune_file(source, checkpoint=out, query="How does `count` work?", budget=60)
    ast.parse(budgeted.text)
    assert budgeted.compressed_tokens <= 60 or budgeted.report["over_budget"]

    script = tmp_path / "reader.js"
    script.write_text(
        'import fs from "fs";\n\nfunction read(p) {\n  if (p) {\n    return fs.readFileSync(p);\n  }\n  return null;\n}\n'
    )
    js = prune_file(script, checkpoint=out, query="How does read work?", threshold=0.0)
    assert js.report["language"] == "javascript" and js.text

    single = train_from_files(
        train,
        tiny_backbone,
        tmp_path / "single",
        rubrics=["semantic"],
        epochs=1,
        batch_size=4,
        trainable_top_layers=0,
        max_length=512,
        val_fraction=0.2,
        log=lambda _: None,
        show_progress=False,
    )
    assert single.fused_target == "teacher"


def test_user_errors_are_one_sentence(tmp_path, corpus):
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"\xff\xfe\x00x = 1\n")
    with pytest.raises(VkvError, match="not UTF-8"):
        prune_file(binary, checkpoint=tmp_path, query="q")
    with pytest.raises(VkvError, match="does not exist"):
        prune_file(tmp_path / "missing.py", checkpoint=tmp_path, query="q")
    (tmp_path / "ok.py").write_text("x = 1\n")
    with pytest.raises(VkvError, match="lamr.json is missing"):
        prune_file(tmp_path / "ok.py", checkpoint=tmp_path, query="q")
    with pytest.raises(VkvError, match="no records"):
        empty = tmp_path / "empty.jsonl"
        empty.write_text("\n")
        train_from_files(empty, "unused", tmp_path / "x")
