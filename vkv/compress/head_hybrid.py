"""Per-head hybrid: each KV head keeps part of its budget as the span's own entries, the ones KVzip's reconstruction
importance ranks best for that head, and spends the rest on virtual tokens, each ranked for it by the most important
token of its block that the head did not keep.

Selection keeps exactly what a head's best entries say and drops the rest; a virtual token can still carry a pooled
trace of what was dropped. So the head's verbatim share is chosen as KVzip chooses, and its virtual share goes to the
blocks whose dropped tokens matter most to it. A virtual token stands, in a head, for the tokens of its block that the
head does not hold verbatim (proportional attention's mass counts only those), so a head's total mass stays at most
the span's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.compaction import Compaction
from vkv.compress.head_budget import HeadBudget, per_head_index
from vkv.compress.pooling import Blocks
from vkv.kv.flat import MASKED
from vkv.kv.prefix import KVPrefix


@dataclass(frozen=True)
class HeadSplit:
    """A KV head's budget split: `verbatim` entries of the span's own, `virtual` virtual tokens (per head, on average
    over a layer's heads with adaptive budgets)."""

    verbatim: int
    virtual: int

    @classmethod
    def of(cls, budget: int, share: float) -> HeadSplit:
        """`share` of `budget` verbatim, at least one entry virtual (a share of 0 keeps none verbatim); a budget of one
        entry takes the share rounded, so a message too short for a virtual token beside its verbatim entries keeps
        its best entry verbatim when the share is a majority."""
        verbatim = round(share * budget) if budget < 2 else min(round(share * budget), budget - 1)
        return cls(verbatim, budget - verbatim)


@dataclass(frozen=True)
class Verbatim:
    """A per-head hybrid's verbatim part given whole, in the span's dense layout: `span_kv` the span's n keys and
    values as the heads hold them (`[1, kv_heads, n, head_dim]` per layer; a head's values may be refitted) and `bias`
    `[layers, kv_heads, n]`, what each head adds to each entry's attention logit, MASKED where it does not hold it."""

    span_kv: KVPrefix
    bias: torch.Tensor

    @property
    def kept(self) -> torch.Tensor:
        """Which of the span's entries each head holds, `[layers, kv_heads, n]`."""
        return self.bias > MASKED

    @classmethod
    def fitted(cls, keys: torch.Tensor, values: torch.Tensor, compaction: Compaction) -> Verbatim:
        """Attention matching's compaction (rows layer-major) in the span's layout: `keys`, `values` `[layers,
        kv_heads, n, head_dim]` the span's own; each head's kept entries carry their fitted biases and refitted
        values, its other entries are masked."""
        layers, heads, n, dim = keys.shape
        rows = layers * heads
        index = compaction.index.masked_fill(~compaction.real, n)  # padding slots land in a column that is dropped
        bias = torch.full((rows, n + 1), MASKED).scatter(1, index, compaction.bias.float())[:, :n]
        refit = torch.cat([values.reshape(rows, n, dim).float(), torch.zeros(rows, 1, dim)], dim=1)
        refit = refit.scatter(1, index[..., None].expand(-1, -1, dim), compaction.values.float())[:, :n]
        refit = refit.reshape(layers, heads, n, dim)
        span_kv = KVPrefix([keys[i][None] for i in range(layers)], [refit[i][None] for i in range(layers)])
        return cls(span_kv, bias.reshape(layers, heads, n))


def reached(index: torch.Tensor, real: torch.Tensor, n: int) -> torch.Tensor:
    """`per_head_index`'s choice as a mask `[layers, heads, n]`: which of the n candidates each head keeps as its
    entries (its other slots are padding)."""
    return torch.zeros(*index.shape[:2], n, dtype=torch.int32).scatter_add_(-1, index, real.int()) > 0


def head_hybrid_bias(
    token_scores: torch.Tensor,
    blocks: Blocks,
    split: HeadSplit,
    rule: HeadBudget,
    proportional_attention: bool,
    offset: float,
    kept: torch.Tensor,
) -> torch.Tensor:
    """The biases `[layers, heads, k]` of the k virtual tokens (blocks over the n pooled tokens) beside each head's
    verbatim part, `kept` `[layers, heads, n]` (`Verbatim.kept`), −inf on padding (a slot whose entry the head does
    not keep). `token_scores` `[layers, heads, n]` is the reconstruction pass's importance of the tokens; each head
    keeps `split.virtual` virtual tokens on average (`rule`: uniform, adaptive or global, compress/head_budget.py),
    those whose blocks hold the best tokens it did not keep verbatim. A kept virtual token's bias is log(its block's
    tokens the head does not hold) with proportional attention, else 0, plus `offset`."""
    left = token_scores.masked_fill(kept, float("-inf"))  # what the head's virtual share may still carry
    virtual = reached(*per_head_index(blocks.most(left), split.virtual, rule), blocks.count)
    block = torch.repeat_interleave(torch.arange(blocks.count), blocks.sizes().long())
    dropped = torch.zeros(*kept.shape[:2], blocks.count).index_add_(-1, block, (~kept).float())
    mass = (dropped.log() if proportional_attention else torch.zeros_like(dropped)) + offset
    return mass.masked_fill(~virtual, MASKED)
