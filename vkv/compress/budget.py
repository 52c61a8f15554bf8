"""How many entries a span keeps: the one rule every method shares.

A span of n tokens compressed at ratio r keeps `round(n / r)` entries per KV head (at least one), whatever the
method; methods that give each head its own share keep that many per head on average (compress/head_budget.py).
Compressing turn by turn shares the span's entries over its turns (`allocate`), so a per-turn run keeps exactly
what a whole-span run of the same ratio keeps.
"""

from __future__ import annotations

import math

from vkv.errors import VkvError

DEFAULT_RATIO = 3.2  # what a command compresses at when it is not told: span tokens per entry
# the method `vkv compress`, `vkv chat`, vkv.compress and a Session use when none is named: the one that keeps the most
# of a later question's answer at every ratio the leaderboard reports (Attention Matching; README, Results); vkv's
# virtual tokens are `--method vkv`
DEFAULT_METHOD = "am"


def span_budget(span_length: int, ratio: float) -> int:
    """Entries a span of `span_length` tokens gets at a ratio someone asked for: refused, not clamped, when the ratio
    is not finite or leaves the span less than one entry."""
    if not (math.isfinite(ratio) and ratio <= span_length):
        raise VkvError(
            f"field ratio: {ratio} leaves less than one entry for the span's {span_length} tokens; "
            f"choose a finite ratio of at most {span_length}"
        )
    return entries_at(span_length, ratio)


def entries_at(span_length: int, ratio: float) -> int:
    """Entries for a span at a ratio, at least one: the rounding of `span_budget` without its refusal, for ratios a
    method tries on its own (auto-ratio's ladder reaches past short turns' lengths)."""
    if span_length <= 0:
        raise VkvError("the span to compress is empty")
    if not ratio >= 1.0:
        raise VkvError(f"compression ratio must be at least 1, got {ratio}")
    return max(1, min(span_length, round(span_length / ratio)))


def allocate(lengths: list[int], total: int) -> list[int]:
    """`total` entries shared over turns of these lengths in proportion to them, by largest remainder, at least one
    entry and at most the turn's length each."""
    if total < len(lengths):
        raise VkvError(
            f"the span's budget of {total} entries cannot give each of its {len(lengths)} turns one; "
            "lower the ratio or compress fewer, longer turns"
        )
    if total > sum(lengths):
        raise VkvError(f"a budget of {total} entries exceeds the {sum(lengths)} tokens of the turns")
    quotas = [length * total / sum(lengths) for length in lengths]
    counts = [max(1, min(length, int(q))) for length, q in zip(lengths, quotas)]
    while sum(counts) != total:
        grow = sum(counts) < total
        movable = [i for i, (c, n) in enumerate(zip(counts, lengths)) if (c < n if grow else c > 1)]
        by_remainder = sorted(movable, key=lambda i: quotas[i] - counts[i], reverse=grow)
        counts[by_remainder[0]] += 1 if grow else -1
    return counts
