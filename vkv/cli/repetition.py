"""Stopping an answer that loops: greedy decoding of a small model on a compressed cache often ends in the same
phrase over and over until max_new_tokens, and a chat would keep the loop in its session.

`loop_start(ids)` finds a tail of `ids` that is one span repeated back to back (at least `times` copies and `least`
tokens in all); `RepetitionGuard` stops `generate()` there and says how many of the answer's tokens to keep: all of
them up to the end of the first copy.
"""

from __future__ import annotations

import math

import torch
from transformers import StoppingCriteria

LEAST = 32  # tokens a loop must cover: runs of one token (a rule of dashes) are not loops until this long
TIMES = 3  # copies of a span that make a loop
LONGEST = 64  # the longest span considered


def loop_start(ids: list[int], least: int = LEAST, times: int = TIMES, longest: int = LONGEST) -> int | None:
    """How many of `ids` to keep when they end in a loop (the tokens before it and its first copy), else None."""
    for period in range(1, longest + 1):
        copies = max(times, math.ceil(least / period))
        span = period * copies
        if span > len(ids):
            continue
        tail = ids[-span:]
        if tail[period:] == tail[:-period]:  # the tail repeats with this period: find where the repeats begin
            start = len(ids) - span
            while start > 0 and ids[start - 1] == ids[start - 1 + period]:
                start -= 1
            return start + period
    return None


class RepetitionGuard(StoppingCriteria):
    """A transformers stopping criterion for one sequence: stops when the new tokens end in a loop; `keep` is then
    the number of new tokens worth keeping."""

    def __init__(self) -> None:
        self.prompt: int | None = None  # ids before the first new token (the cache's placeholders and the prompt)
        self.keep: int | None = None

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        if self.prompt is None:  # first call: one new token so far
            self.prompt = input_ids.shape[1] - 1
        self.keep = loop_start(input_ids[0, self.prompt :].tolist())
        return torch.full((input_ids.shape[0],), self.keep is not None, dtype=torch.bool, device=input_ids.device)
