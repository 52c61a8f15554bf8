"""How a span's entry budget is spent over the KV heads of a layer, given every entry's score per layer and head.

- `shared`: every head keeps the same tokens, those with the best mean score;
- `uniform`: each head keeps its own `budget` best entries;
- `adaptive` (AdaKV, Feng et al. 2024), within each layer: a layer's `budget × heads` entries go to the best scores
  across all its heads, after a safeguard share of the uniform budget per head, so heads whose attention is
  concentrated give entries to heads where it is spread; every layer keeps the same total;
- `global` (KVzip's allocation, Kim et al. 2025, as kvpress's KVzipPress runs it): the span's `budget × layers ×
  heads` entries go to the best scores over every layer and KV head at once, one threshold, so layers differ too.
  It needs scores comparable across layers (attention probabilities are). No safeguard, as in the reference, but one
  entry per head: a head that keeps nothing of the span cannot be stored (kv/file.py), and one entry a head is a
  negligible share of any budget.

Heads then keep different numbers of entries, but a cache holds the same number per head: a head's unused slots
are padding, masked out of attention by a bias of −inf (`real` says which slots hold entries).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch

from vkv.kv.segment import MASKED, SeparableBias
from vkv.settings import setting

ADAKV_SAFEGUARD = 0.2  # AdaKV's α: every head keeps at least this share of the uniform budget


class HeadBudget(str, Enum):
    """How a span's budget is spent over the KV heads (the rules above). A member is its name as configs, flags, sweep
    keys and JSON spell it (`HeadBudget.GLOBAL == "global"`), so records and run ids do not change; code asks the
    member what the rule does instead of comparing names."""

    SHARED = "shared"
    UNIFORM = "uniform"
    ADAPTIVE = "adaptive"
    GLOBAL = "global"

    # the plain name in messages, help and f-strings, as JSON writes it
    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def of(cls, value: str) -> HeadBudget:
        """`value` (a member, or its name as the Python API passes it) as a member; ValueError naming the choices."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown head budget {value!r}; choose one of {', '.join(cls)}") from None

    @property
    def per_head(self) -> bool:
        """Whether each head keeps its own entries: all but `shared`, whose heads keep the same tokens."""
        return self is not HeadBudget.SHARED

    @property
    def moves_entries(self) -> bool:
        """Whether heads compete for entries, so that their counts differ (`adaptive`, `global`); under the other
        rules each head keeps the budget."""
        return self in (HeadBudget.ADAPTIVE, HeadBudget.GLOBAL)

    def floor(self, budget: int) -> int:
        """Of a rule that moves entries: the entries each head keeps before the competition for the rest, AdaKV's
        safeguard share within a layer, one for the global threshold."""
        return 1 if self is HeadBudget.GLOBAL else max(1, int(ADAKV_SAFEGUARD * budget))

    def pool(self, layers: int, heads: int, n: int) -> tuple[int, int]:
        """Of a rule that moves entries: who competes for the entries past the floor, as the shape `[groups,
        candidates]` the scores `[layers, heads, n]` are viewed as: every layer and head at once (`global`), or each
        layer's heads (`adaptive`)."""
        return (1, layers * heads * n) if self is HeadBudget.GLOBAL else (layers, heads * n)


def head_budget_setting(default: HeadBudget = HeadBudget.ADAPTIVE) -> Any:
    """The `head_budget` field, declared once for every method that keeps a budget (virtual tokens' recipe and each
    scorer): the same name, choices and help everywhere. The default is AdaKV's split, chosen on the dev split
    (evals/RESULTS.md, "Head-wise budgets (dev, 3.2×)"); a method whose scores are not comparable across heads
    declares its own."""
    return setting(
        default,
        "how the span's entries are split over layers and KV heads: shared (the same entries in every head), uniform "
        "(each head its own best, the same count), adaptive (AdaKV within each layer: heads whose attention is spread "
        "get more, every layer the same total), global (KVzip's: one threshold over every layer and head)",
        HeadBudget,
    )


def per_head_index(scores: torch.Tensor, budget: int, rule: HeadBudget | str) -> tuple[torch.Tensor, torch.Tensor]:
    """Entries each head keeps for `scores` `[layers, heads, n]` (higher is better) → (`index` `[layers, heads, t]`
    ascending span-relative indices, `real` `[layers, heads, t]` bool). `budget` is the mean per head: every layer
    keeps `budget × heads` entries, or with `global` the span `budget × layers × heads`; padding slots repeat
    the head's first entry."""
    rule = HeadBudget.of(rule)
    layers, heads, n = scores.shape
    if not 1 <= budget <= n:
        raise ValueError(f"cannot keep {budget} of {n} entries per head")
    if not rule.per_head:
        index = scores.mean(dim=(0, 1)).topk(budget).indices.sort().values.expand(layers, heads, -1)
        return index, torch.ones_like(index, dtype=torch.bool)
    if not rule.moves_entries:
        index = scores.topk(budget, dim=-1).indices.sort(-1).values
        return index, torch.ones_like(index, dtype=torch.bool)
    kept = torch.zeros(layers, heads, n, dtype=torch.bool, device=scores.device)
    floor = rule.floor(budget)
    kept.scatter_(-1, scores.topk(floor, dim=-1).indices, True)
    pool = rule.pool(layers, heads, n)
    rest = scores.masked_fill(kept, float("-inf")).reshape(pool)
    chosen = rest.topk(pool[1] // n * (budget - floor), dim=-1).indices
    kept.view(pool).scatter_(-1, chosen, True)
    counts = kept.sum(-1)  # [layers, heads]
    # Kept entries first (ascending), then the rest: the first `count` columns of each row are its entries.
    column = torch.arange(n, device=scores.device)
    order = torch.where(kept, column, n + column).argsort(-1)[..., : int(counts.max())]
    real = torch.arange(order.shape[-1], device=scores.device) < counts[..., None]
    return torch.where(real, order, order[..., :1]), real


def mask_per_head(scores: torch.Tensor, per_entry: torch.Tensor, budget: int, rule: HeadBudget | str) -> SeparableBias:
    """Entries kept in place, each head attending only to its share: the bias `per_entry` `[n]`, shared by every head,
    with every entry outside the head's `per_head_index(scores, budget, rule)` masked (−inf), and the kept entries'
    raised by one offset per head so that they keep the total weight Σ exp(bias) all n had (n tokens stay n tokens'
    worth of mass). `scores` `[layers, heads, n]`."""
    index, real = per_head_index(scores, budget, rule)
    kept = torch.zeros(scores.shape, dtype=torch.int32).scatter_add_(-1, index, real.int()) > 0
    shared = per_entry.float().expand(scores.shape)
    offset = shared.logsumexp(-1) - shared.masked_fill(~kept, MASKED).logsumexp(-1)
    return SeparableBias(per_entry.float(), offset, kept)
