"""Segment: K/V entries standing for a range of original tokens; SegmentGroup: several that stand for one span."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from vkv.kv.flat import MASKED
from vkv.kv.prefix import KVPrefix

KINDS = ("verbatim", "virtual", "compact")  # compact: real keys, chosen per layer and KV head, fitted biases/values


@dataclass(frozen=True)
class SeparableBias:
    """A bias `[layers, kv_heads, slots]` that is one number per slot plus one per layer and KV head where `real`,
    −inf on padding: what masking a bias shared by every head per head gives (compress/head_budget.py). A file stores
    these (the mask as bits) instead of the dense floats; `dense()` gives back the same floats, bit for bit, because
    it is the same float32 sum the mask computed."""

    per_entry: torch.Tensor  # [slots] float32
    per_head: torch.Tensor  # [layers, kv_heads] float32
    real: torch.Tensor  # [layers, kv_heads, slots] bool: the slots that hold entries (the rest is padding)

    def dense(self) -> torch.Tensor:
        """`[layers, kv_heads, slots]` float32."""
        return (self.per_entry.float() + self.per_head.float()[..., None]).masked_fill(~self.real, MASKED)


@dataclass
class Segment:
    """K/V entries standing for original tokens [span[0], span[1]), in slots (see `vkv.kv` for the counting words)."""

    kind: str
    span: tuple[int, int]
    keys: torch.Tensor  # [layers, kv_heads, slots, head_dim], post-RoPE, as the model stores them
    values: torch.Tensor  # [layers, kv_heads, slots, head_dim]
    positions: torch.Tensor  # [slots] float32 logical positions
    embeddings: torch.Tensor | None = None  # [slots, hidden] for virtual segments
    stats: dict[str, Any] = field(default_factory=dict)
    bias: torch.Tensor | None = None  # [layers, kv_heads, slots] float32, added to every later query's attention
    # logit for the entry, per layer and KV head (a fitted bias; or proportional attention's log of the tokens an
    # entry stands for, shared by all; −inf on padding); None: no bias
    separable: SeparableBias | None = None  # `bias` again as per-entry and per-head numbers, when it is that sum

    @property
    def slots(self) -> int:
        """Slots per layer and KV head, padding included: what a padded cache stores (cache files name them
        `entries`)."""
        return self.keys.shape[2]

    @property
    def real_entries(self) -> float:
        """Entries per KV head: the slots that are not padding, averaged over layers and KV heads (head-wise budgets
        pad the heads that keep fewer). The ratio counts these."""
        if self.bias is None or bool(torch.isfinite(self.bias).all()):
            return self.slots
        return float(torch.isfinite(self.bias).sum()) / (self.bias.shape[0] * self.bias.shape[1])

    @property
    def carries_bias(self) -> bool:
        """Whether an entry has a nonzero bias (the −inf of padding is not a bias)."""
        if self.bias is None:
            return False
        entries = self.bias[torch.isfinite(self.bias)]
        return bool((entries != 0).any())

    @property
    def original_tokens(self) -> int:
        return self.span[1] - self.span[0]

    @property
    def compressed(self) -> bool:
        """Whether the segment stands for its tokens by other entries or by fewer of them (an eviction keeps a subset
        of a message's own tokens, as a segment of kind verbatim)."""
        return self.kind != "verbatim" or self.slots < self.original_tokens

    @property
    def ratio(self) -> float:
        return self.original_tokens / max(self.real_entries, 1)

    @property
    def kv(self) -> KVPrefix:
        """The slots as a batch-1 prefix, `[1, kv_heads, slots, head_dim]` per layer (views)."""
        bias = None if self.bias is None else [b[None] for b in self.bias]
        return KVPrefix([k[None] for k in self.keys], [v[None] for v in self.values], None, bias)

    def entry_counts(self) -> dict[str, Any]:
        """`entries` (slots per layer and KV head); when some are padding (head-wise budgets), `real_entries` (entries
        per KV head) and `reached` (the entries of all layers and KV heads together); `biased`: whether an entry carries
        a nonzero bias. A cache file's header records these, under these names, which is all the arithmetic of the
        decoding cache's memory needs (`vkv.kv.ragged.memory_plan`)."""
        counts: dict[str, Any] = {"entries": self.slots}  # the file's name for slots
        if self.real_entries != self.slots:
            counts.update(real_entries=round(self.real_entries, 2), reached=int(torch.isfinite(self.bias).sum()))
        counts["biased"] = self.carries_bias
        return counts

    def compacted(self) -> Segment:
        """The same entries in the fewest slots, as a compact segment (`compact_segment`): each layer's and KV head's
        entries (finite bias) in slot order, padded to the most entries any head has (the layout of kvzip's per-head
        segments). Later queries attend to the same keys, values and biases, so only the memory changes; embeddings go,
        since a slot no longer stands for one input for every head."""
        reach = torch.isfinite(self.bias)  # [layers, kv_heads, slots]: the slots that hold entries
        counts = reach.sum(-1)
        slots = int(counts.max())
        order = (~reach).to(torch.uint8).argsort(dim=-1, stable=True)[..., :slots]  # entries first, in slot order
        keys, values = (t.gather(2, order[..., None].expand(-1, -1, -1, t.shape[-1])) for t in (self.keys, self.values))
        return compact_segment(
            self.span,
            keys,
            values,
            self.positions.float()[order],
            real=torch.arange(slots) < counts[..., None],
            bias=self.bias.float().gather(2, order),
            stats={**self.stats, "compacted_from": self.slots},
        )

    def row(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "span": list(self.span),
            **self.entry_counts(),
            "ratio": round(self.ratio, 4),
            **{k: v for k, v in self.stats.items() if not isinstance(v, (list, dict))},
        }


def compact_segment(
    span: tuple[int, int],
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    real: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    stats: dict[str, Any] | None = None,
    start: int = 0,
) -> Segment:
    """A compact segment standing for `span`: each layer and KV head its own entries, `keys` and `values`
    `[layers, kv_heads, slots, head_dim]` (post-RoPE) at original positions `start + positions`
    `[layers, kv_heads, slots]`, with `bias` `[layers, kv_heads, slots]` or None. With `real` `[layers, kv_heads,
    slots]` (head-wise budgets: each head's entries in its first slots), a False slot is padding: a copy of its
    head's first entry whose bias is −inf (a missing bias is 0 elsewhere). Slot j's position is the mean position of
    the j-th entries of every head; `start` is added after the mean, so that span-relative positions round as they
    always have."""
    if real is None:
        mean = positions.float().mean(dim=(0, 1))
    else:
        bias = (torch.zeros(real.shape) if bias is None else bias).masked_fill(~real, MASKED)
        # padding is a copy of its head's first entry, as cache files restore it (kv/file.py)
        keys, values = (torch.where(real[..., None], t, t[:, :, :1]).contiguous() for t in (keys, values))
        mean = (positions * real).sum(dim=(0, 1)) / real.sum(dim=(0, 1)).clamp_min(1)
    return Segment("compact", span, keys, values, mean.float() + start, bias=bias, stats=stats or {})


def interleaved(own: Segment, virtual: Segment) -> tuple[Segment, torch.Tensor]:
    """A span's own entries (`own`) and the virtual entries standing for the rest of it (`virtual`) as one virtual
    segment of `virtual.span`, every slot sorted by position (own entries first at a tie), float32 on the host, with
    `virtual`'s stats. Embeddings and biases are joined when both have them (a bias on one side only is refused). Second:
    the slots that hold `own`'s entries."""
    if (own.bias is None) != (virtual.bias is None):
        raise ValueError("interleaved: both segments carry biases or neither does")
    positions = torch.cat([own.positions.float(), virtual.positions.float()])
    order = positions.argsort(stable=True)

    def joined(a: torch.Tensor | None, b: torch.Tensor | None, dim: int = 2) -> torch.Tensor | None:
        if a is None or b is None:
            return None
        return torch.cat([a.float().cpu(), b.float().cpu()], dim=dim).index_select(dim, order)

    segment = Segment(
        "virtual",
        virtual.span,
        joined(own.keys, virtual.keys),
        joined(own.values, virtual.values),
        positions[order],
        joined(own.embeddings, virtual.embeddings, dim=0),
        virtual.stats,
        joined(own.bias, virtual.bias),
    )
    return segment, (order < own.slots).nonzero()[:, 0]


def verbatim_segment(kv: KVPrefix, start: int) -> Segment:
    """A verbatim segment from a batch-1 prefix whose entries are the real K/V of tokens [start, start + n)."""
    keys, values = kv.stacked()
    n = keys.shape[2]
    return Segment(
        "verbatim", (start, start + n), keys, values, torch.arange(start, start + n).float(), bias=kv.stacked_bias()
    )


def mass_bias(mass: torch.Tensor, layers: int, kv_heads: int) -> torch.Tensor:
    """Proportional attention as a bias: log of the tokens each entry stands for, `[entries]`, shared by every
    layer and KV head → `[layers, kv_heads, entries]`. An entry standing for m tokens draws the attention m
    copies of it would."""
    return mass.float().log().expand(layers, kv_heads, -1).contiguous()


def most_entries_per_head(segments: list[Segment]) -> int:
    """The most entries any layer's KV head holds over `segments` (padding does not count): what a cap bounds."""
    if not segments:
        return 0
    layers, kv_heads = segments[0].keys.shape[:2]
    held = torch.zeros(layers, kv_heads, dtype=torch.long)
    for s in segments:
        held += s.slots if s.bias is None else torch.isfinite(s.bias).sum(-1)
    return int(held.max())


class SegmentGroup(list):
    """Segments in span order (non-overlapping), plus stats describing the whole group."""

    def __init__(self, segments: Iterable[Segment] = (), stats: dict[str, Any] | None = None):
        super().__init__(segments)
        self.stats: dict[str, Any] = stats or {}

    @property
    def real_entries(self) -> float:
        """Entries per KV head, summed over the segments: what the ratio counts (each segment's `real_entries`)."""
        return sum(s.real_entries for s in self)

    @property
    def original_tokens(self) -> int:
        return sum(s.original_tokens for s in self)
