"""Chunking, overlap averaging by character span, line keep fractions, line selection, records."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from vkv.backends.lamr.inference import ChunkScores, combine, select_lines
from vkv.backends.lamr.prompt import Chunk, CodeTokens, make_chunks
from vkv.backends.lamr.records import read_records
from vkv.errors import VkvError

TOKENIZER = Path.home() / ".cache" / "vkv" / "models" / "smollm2-135m"


def chunk_scores(chunk, decisions, probabilities=None):
    decisions = np.asarray(decisions, dtype=float)
    probabilities = decisions if probabilities is None else np.asarray(probabilities, dtype=float)
    return ChunkScores(chunk, decisions, probabilities, 0.5)


def test_overlapping_chunks_average_per_character():
    code = "aaaa\nbb\ncc\n"
    # tokens: "aaaa" "\n" "bb" "\n" "cc" "\n"
    tokens = CodeTokens(list(range(6)), [(0, 4), (4, 5), (5, 7), (7, 8), (8, 10), (10, 11)])
    first = Chunk([], 0, 0, 4)  # tokens 0-3
    second = Chunk([], 0, 2, 6)  # tokens 2-5: "bb" and "\n" are seen twice
    lines = combine(code, tokens, [chunk_scores(first, [1, 1, 1, 0]), chunk_scores(second, [0, 1, 0, 0])])
    assert lines.keep_fraction[0] == 1.0
    assert lines.keep_fraction[1] == 0.5  # "bb": 1 in the first chunk, 0 in the second
    assert lines.keep_fraction[2] == 0.0
    assert lines.chunks == 2 and lines.relevance == 0.5


def test_line_fraction_is_character_weighted():
    code = "abcdefgh\n"
    tokens = CodeTokens([0, 1, 2], [(0, 6), (6, 8), (8, 9)])  # a long token kept, a short one not
    lines = combine(code, tokens, [chunk_scores(Chunk([], 0, 0, 3), [1, 0, 0], [0.9, 0.1, 0.0])])
    assert lines.keep_fraction[0] == pytest.approx(6 / 8)  # the newline does not count
    assert lines.keep_probability[0] == pytest.approx((6 * 0.9 + 2 * 0.1) / 8)


def test_select_lines_threshold_and_blank_lines():
    code = "a\n\nb\n\nc\n\n"
    values = [0.5, math.nan, 0.4, math.nan, 0.39, math.nan]
    assert select_lines(code, values, 0.4) == {0, 1, 2}  # the blank between two kept lines follows them
    assert select_lines(code, values, 0.45) == {0}


@pytest.mark.skipif(not (TOKENIZER / "tokenizer.json").is_file(), reason="smollm2-135m tokenizer not fetched")
def test_chunks_cover_code_with_overlap():
    from transformers import AutoTokenizer

    from vkv.backends.lamr.prompt import tokenize_code

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    code = "".join(f"value_{i} = {i} * 2\n" for i in range(80))
    tokens = tokenize_code(tokenizer, code)
    chunks = make_chunks(tokenizer, tokens, "what is value_3?", max_length=200, overlap=10)
    assert len(chunks) > 2 and all(len(c.input_ids) <= 200 for c in chunks)
    assert chunks[0].token_start == 0 and chunks[-1].token_end == len(tokens.ids)
    for left, right in zip(chunks, chunks[1:]):
        assert right.token_start == left.token_end - 10
    for chunk in chunks:
        window = chunk.input_ids[chunk.code_start : chunk.code_start + chunk.code_len]
        assert window == tokens.ids[chunk.token_start : chunk.token_end]
    with pytest.raises(VkvError, match="max_length"):
        make_chunks(tokenizer, tokens, "q", max_length=90, overlap=10)


def test_records_are_validated_with_file_and_field(tmp_path):
    good = {"query": "q", "code": "a\nb\n", "kept_frags": [2], "score": 0.5}
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good) + "\n\n")
    (record,) = read_records(path)
    assert record.kept_lines == [1] and record.language == "python"
    for field, value, message in [
        ("kept_frags", [3], "outside 1..2"),
        ("kept_frags", [0], "outside"),
        ("score", 1.5, "'score'"),
        ("query", "", "'query'"),
        ("code", None, "'code'"),
    ]:
        path.write_text(json.dumps(good) + "\n" + json.dumps({**good, field: value}) + "\n")
        with pytest.raises(VkvError, match=message) as info:
            read_records(path)
        assert f"{path}:2" in str(info.value)
