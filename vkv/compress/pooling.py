"""Partition a span into k contiguous blocks and weight the tokens inside each block.

The weights pool both the target Value vectors and the token embeddings that initialise the virtual
tokens. `surprisal` (weight ∝ −log p of the token) is the recipe: predictable tokens count less, so the
pooled vector sits closer to the informative ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vkv.errors import VkvError
from vkv.registry import registrar


@dataclass(frozen=True)
class Blocks:
    """Block i covers span-relative tokens [edges[i], edges[i+1])."""

    edges: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.edges) - 1

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.edges[:-1], self.edges[1:]))

    def sizes(self) -> torch.Tensor:
        """Tokens per block `[count]` (float32): the mass proportional attention gives each virtual token."""
        return torch.tensor([hi - lo for lo, hi in self.ranges()], dtype=torch.float32)

    def centres(self, token_positions: torch.Tensor) -> torch.Tensor:
        """Mean of `token_positions` `[span]` (the blocked tokens' original positions) per block → `[count]`."""
        return torch.stack([token_positions[lo:hi].float().mean() for lo, hi in self.ranges()])

    def most(self, per_token: torch.Tensor) -> torch.Tensor:
        """The largest of `per_token` `[..., span]` within each block → `[..., count]`."""
        block = torch.repeat_interleave(torch.arange(self.count), self.sizes().long())
        out = torch.full((*per_token.shape[:-1], self.count), float("-inf"), dtype=per_token.dtype)
        return out.scatter_reduce_(-1, block.expand_as(per_token), per_token, "amax")


def partition(span_length: int, k: int, cut_candidates: list[int] | None = None) -> Blocks:
    """k blocks of (nearly) equal token counts; with cut candidates, each edge snaps to the nearest one
    (message or line starts) that keeps every block non-empty."""
    ideal = torch.linspace(0, span_length, k + 1).round().long().tolist()
    if not cut_candidates:
        return Blocks(tuple(ideal))
    candidates = sorted(set(c for c in cut_candidates if 0 < c < span_length))
    edges = [0]
    for i, target in enumerate(ideal[1:-1], start=1):
        lo, hi = edges[-1] + 1, span_length - (k - i)  # leave room for the remaining blocks
        options = [c for c in candidates if lo <= c <= hi]
        edges.append(min(options, key=lambda c: (abs(c - target), c)) if options else min(max(target, lo), hi))
    edges.append(span_length)
    return Blocks(tuple(edges))


def partition_by_mass(mass: torch.Tensor, k: int) -> Blocks:
    """k contiguous, non-empty blocks holding (nearly) equal shares of `mass` `[span]` (non-negative), so
    dense stretches of the span get more, shorter blocks; equal token counts when the mass is all zero."""
    span_length = mass.numel()
    if not 0 < k <= span_length:
        raise VkvError(f"cannot split a span of {span_length} tokens into {k} blocks")
    if not torch.isfinite(mass).all() or (mass < 0).any():
        raise VkvError("block mass must be finite and non-negative")
    total = mass.double().sum()
    if total <= 0:
        return partition(span_length, k)
    cumulative = torch.cat([torch.zeros(1, dtype=torch.float64), mass.double().cumsum(0)])  # [span + 1]
    edges = [0]
    for i in range(1, k):
        target = total * i / k
        after = int(torch.searchsorted(cumulative, target))  # first edge with cumulative mass ≥ target
        nearest = after if after == 0 or cumulative[after] - target <= target - cumulative[after - 1] else after - 1
        lo, hi = edges[-1] + 1, span_length - (k - i)  # leave room for the remaining blocks
        edges.append(min(max(nearest, lo), hi))
    edges.append(span_length)
    return Blocks(tuple(edges))


def block_mass(surprisal: torch.Tensor, floor: float = 0.0) -> torch.Tensor:
    """Per-token mass `[span]` that surprisal blocks share equally: the token's surprisal plus `floor` times
    the span's mean, so no token counts for less than `floor` × an average one (0: surprisal alone; a large
    floor tends to equal token counts)."""
    if not floor >= 0:
        raise VkvError(f"the block mass floor must be ≥ 0, got {floor}")
    scores = surprisal_scores(surprisal.float())
    return scores + floor * scores.mean()


WeightRule = Callable[..., torch.Tensor]
POOLING_RULES: dict[str, WeightRule] = {}
rule = registrar(POOLING_RULES)


@rule("uniform")
def uniform_scores(surprisal: torch.Tensor, **_) -> torch.Tensor:
    return torch.ones_like(surprisal)


@rule("surprisal")
def surprisal_scores(surprisal: torch.Tensor, **_) -> torch.Tensor:
    s = surprisal.clone()
    known = torch.isfinite(s)
    s[~known] = s[known].mean() if known.any() else 1.0  # a sequence's first token has no surprisal
    return s.clamp_min(0.0)


@rule("attention")
def attention_scores(surprisal: torch.Tensor, attention: torch.Tensor | None = None, **_) -> torch.Tensor:
    if attention is None:
        raise VkvError("attention pooling needs a question's attention to the span (it is question-specific)")
    return attention.clone()


def block_weights(name: str, blocks: Blocks, surprisal: torch.Tensor, attention: torch.Tensor | None = None):
    """Per-token weights `[span]` that sum to 1 within each block (uniform where a block's scores are all 0)."""
    if name not in POOLING_RULES:
        raise VkvError(f"unknown pooling rule '{name}'; choose one of {', '.join(POOLING_RULES)}")
    scores = POOLING_RULES[name](surprisal=surprisal.float(), attention=attention).float()
    weights = torch.empty_like(scores)
    for lo, hi in blocks.ranges():
        block = scores[lo:hi]
        total = block.sum()
        weights[lo:hi] = block / total if total > 0 else torch.full_like(block, 1.0 / (hi - lo))
    return weights


def pool(x: torch.Tensor, blocks: Blocks, weights: torch.Tensor, dim: int) -> torch.Tensor:
    """Weighted sum of `x` over each block along `dim` → that dim becomes `blocks.count`."""
    w = weights.to(x.dtype).to(x.device)
    pooled = [
        (x.narrow(dim, lo, hi - lo) * w[lo:hi].reshape([-1] + [1] * (x.dim() - dim - 1))).sum(dim)
        for lo, hi in blocks.ranges()
    ]
    return torch.stack(pooled, dim=dim)
