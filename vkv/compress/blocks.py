"""Where a span's blocks begin and end: equal token counts, snapped to line starts, or equal surprisal mass.

Each of the k virtual tokens stands for one contiguous block of the span's tokens.
"""

from __future__ import annotations

import torch

from vkv.compress.config import BOUNDARIES, CompressConfig
from vkv.compress.pooling import Blocks, block_mass, partition, partition_by_mass
from vkv.errors import VkvError
from vkv.lm.frozen import FrozenLM


def line_cuts(lm: FrozenLM, ids: list[int], start: int, end: int, message_starts: list[int]) -> list[int]:
    """Span-relative indices where a block may start: after a newline token, or at a message start."""
    cuts = {m - start for m in message_starts if start < m < end}
    for i, tid in enumerate(ids[start : end - 1]):
        if "\n" in lm.tokenizer.decode([tid]):
            cuts.add(i + 1)
    return sorted(cuts)


def span_blocks(
    lm: FrozenLM,
    ids: list[int],
    start: int,
    end: int,
    k: int,
    config: CompressConfig,
    surprisal: torch.Tensor,
    message_starts: list[int] | None = None,
    tokens: torch.Tensor | None = None,
) -> Blocks:
    """The k blocks, laid out by `config.boundaries`, of the tokens of ids[start:end] that k virtual tokens
    stand for: all of them, or only `tokens` `[n]` (ascending span-relative indices, e.g. hybrid's
    non-verbatim ones). `surprisal` holds those tokens' surprisal; with boundaries 'surprisal' every block
    gets an equal share of it, so informative stretches get more virtual tokens."""
    if config.boundaries not in BOUNDARIES:
        raise VkvError(f"unknown block boundaries '{config.boundaries}'; choose one of {', '.join(BOUNDARIES)}")
    if config.boundaries == "surprisal":
        return partition_by_mass(block_mass(surprisal, config.mass_floor), k)
    cuts = None
    if config.boundaries == "lines":
        cuts = line_cuts(lm, ids, start, end, message_starts or [])
        if tokens is not None:  # a cut before original token c falls before the first kept token at or after c
            cuts = sorted(set(torch.searchsorted(tokens, torch.tensor(cuts, dtype=torch.long)).tolist()))
    return partition(end - start if tokens is None else len(tokens), k, cuts)
