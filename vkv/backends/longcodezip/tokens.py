"""Tokens ↔ lines: which line each token belongs to, and how many tokens each line costs."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np


@dataclass
class TokenizedLines:
    """Token ids of some consecutive lines and, for every token, the (relative) line it belongs to."""

    ids: list[int]
    line_of_token: np.ndarray  # int64 [tokens]
    line_count: int

    def tokens_per_line(self) -> np.ndarray:
        return np.bincount(self.line_of_token, minlength=self.line_count).astype(np.int64)


def tokenize_lines(tokenizer, lines: list[str]) -> TokenizedLines:
    """Tokenize the lines as one text; a token belongs to the line holding its last character.

    A token like "\\n    " (newline plus the next line's indentation) therefore counts for the line it
    introduces, and a lone "\\n" for the line it ends.
    """
    text = "".join(lines)
    if not text:
        return TokenizedLines([], np.zeros(0, dtype=np.int64), len(lines))
    try:
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    except NotImplementedError:  # slow tokenizers have no offsets: tokenize line by line instead
        return _tokenize_each_line(tokenizer, lines)
    starts = np.cumsum([0] + [len(line) for line in lines[:-1]]).tolist()
    owners = [bisect_right(starts, max(end - 1, begin)) - 1 for begin, end in encoded["offset_mapping"]]
    return TokenizedLines(list(encoded["input_ids"]), np.asarray(owners, dtype=np.int64), len(lines))


def _tokenize_each_line(tokenizer, lines: list[str]) -> TokenizedLines:
    ids: list[int] = []
    owners: list[int] = []
    for index, line in enumerate(lines):
        line_ids = tokenizer(line, add_special_tokens=False, verbose=False)["input_ids"]
        ids.extend(line_ids)
        owners.extend([index] * len(line_ids))
    return TokenizedLines(ids, np.asarray(owners, dtype=np.int64), len(lines))


def count_tokens(tokenizer, text: str) -> int:
    """Tokens of `text` without special tokens: the unit every budget in this backend is measured in."""
    if not text:
        return 0
    return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]) if text else []
