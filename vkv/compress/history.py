"""A running cache under a cap: at most `cap` entries per KV head for the compressed history (on average over layers
and heads, as a ratio counts them: the decoding cache's memory), however long the conversation grows. When a new
chunk's segment takes the history past the cap, the loop's segments (older ones and the new one) are compacted again,
by the method's own rule and its own split of the budget over heads, into one segment that fits (`HistoryCap.hold`);
what a method is given for that is a `HistoryWork`: the history's entries as one set per head (`History`), the cache
before it, the text the history stands for, and the newest chunk as the model read it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vkv.compress.head_budget import HeadBudget, per_head_index
from vkv.compress.turn import Turn, TurnView, chunk_turns, split_recent
from vkv.compress.work import Reusing
from vkv.errors import VkvError
from vkv.kv.segment import Segment, compact_segment, most_entries_per_head
from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM


@dataclass
class History:
    """Compressed segments as one set of entries per layer and KV head, slots in segment order: `keys` and `values`
    `[layers, kv_heads, slots, head_dim]` float32, `bias` `[layers, kv_heads, slots]` (0 where a segment had none, −inf
    on padding), `positions` `[layers, kv_heads, slots]` each slot's segment position."""

    span: tuple[int, int]
    keys: torch.Tensor
    values: torch.Tensor
    bias: torch.Tensor
    positions: torch.Tensor

    @classmethod
    def of(cls, segments: list[Segment]) -> History:
        layers, kv_heads = segments[0].keys.shape[:2]

        def joined(get) -> torch.Tensor:
            return torch.cat([get(s).float().cpu() for s in segments], dim=2)

        return cls(
            (segments[0].span[0], segments[-1].span[1]),
            joined(lambda s: s.keys),
            joined(lambda s: s.values),
            joined(lambda s: torch.zeros(s.keys.shape[:3]) if s.bias is None else s.bias),
            joined(lambda s: s.positions.float().expand(layers, kv_heads, -1)),
        )

    @property
    def real(self) -> torch.Tensor:
        """`[layers, kv_heads, slots]` bool: the slots that hold entries."""
        return torch.isfinite(self.bias)

    def segment(self) -> Segment:
        """The history as it is, one compact segment."""
        return compact_segment(self.span, self.keys, self.values, self.positions, self.real, self.bias)

    def keep(
        self,
        index: torch.Tensor,
        real: torch.Tensor,
        values: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> Segment:
        """A compact segment of each head's slots `index` `[layers, kv_heads, t]` (`real` False on padding) with their
        own values and biases, or fitted `values` `[layers, kv_heads, t, head_dim]` and `bias` `[layers, kv_heads, t]`."""
        dim = self.keys.shape[-1]

        def gather(t: torch.Tensor) -> torch.Tensor:
            return t.gather(2, index[..., None].expand(-1, -1, -1, dim))

        return compact_segment(
            self.span,
            gather(self.keys),
            gather(self.values) if values is None else values.float().cpu(),
            self.positions.gather(2, index),
            real,
            self.bias.gather(2, index) if bias is None else bias.float().cpu(),
        )


@dataclass
class HistoryWork(Reusing):
    """What a method is given to compact a running cache's history again: the history's entries, the cache before
    them, the tokens they stand for (`ids[start:end]`, which a read-out pass repeats, as for a span) and the newest
    chunk as the model read it on top of the cache (`recent`, its queries included)."""

    lm: FrozenLM
    ids: list[int]
    before: SplicedCache  # ends where the history starts
    history: History
    recent: TurnView
    seed: int = 0

    @property
    def start(self) -> int:
        return self.history.span[0]

    @property
    def end(self) -> int:
        return self.history.span[1]

    def prefix_cache(self) -> SplicedCache:
        return self.before.fork()

    def span_entries(self) -> Segment:
        return self.history.segment()

    def recent_attention(self, window: int) -> torch.Tensor:
        """The mean attention `[layers, kv_heads, slots]` the newest chunk's last `window` tokens give each history
        slot (over the query heads of a KV head), each query's softmax over the cache before the history, the history
        and the chunk up to itself, as the model read them."""
        acts, lm = self.recent.acts, self.lm
        queries = acts.queries_pre_rope[:, :, -window:]  # [layers, heads, w, head_dim]
        positions = torch.arange(acts.end - queries.shape[2], acts.end).float()
        group = lm.spec.num_heads // lm.spec.num_kv_heads
        before = self.before.kv()
        out = []
        for layer in range(queries.shape[0]):
            q = lm.rotate(queries[layer].to(lm.device).float(), positions) * lm.spec.head_dim**-0.5  # [H, w, D]
            parts = [
                (before.keys[layer][0], None if before.bias is None else before.bias[layer][0])
                if before.keys
                else None,
                (self.history.keys[layer], self.history.bias[layer]),
                (self.recent.kv.keys[layer][0], None),
            ]
            scores = []
            for part in parts:
                if part is None:
                    continue
                k, b = part
                s = q @ k.to(lm.device).float().repeat_interleave(group, 0).transpose(1, 2)
                scores.append(s if b is None else s + b.to(lm.device).float().repeat_interleave(group, 0)[:, None])
            own = scores[-1]
            w = own.shape[1]
            causal = torch.ones(w, own.shape[2], dtype=torch.bool, device=own.device).tril(own.shape[2] - w)
            scores[-1] = own.masked_fill(~causal, float("-inf"))
            first = scores[0].shape[-1] if len(scores) == 3 else 0
            attention = torch.cat(scores, dim=-1).softmax(-1)[..., first : first + self.history.keys.shape[2]]
            out.append(attention.mean(1).reshape(lm.spec.num_kv_heads, group, -1).mean(1))
        return torch.stack(out).cpu()


@dataclass
class HistoryCap:
    """At most `entries` entries per KV head on average for the loop's segments; `compact(work, entries)` is the
    method's rule for compacting its history again (a segment of at most `entries` per KV head on average)."""

    entries: int
    compact: Callable[[HistoryWork, int], Segment]

    def hold(self, lm: FrozenLM, ids: list[int], cache: SplicedCache, first: int, recent: TurnView, seed: int) -> int:
        """Compact the compressed history (the segments from the first compressed one, or from the loop's `first`
        if earlier) into one segment in place when they hold more than the cap; the cache before them and its next
        position do not change. Returns the index of the history's first segment."""
        first = min([first] + [i for i, s in enumerate(cache.segments) if s.compressed][:1])
        loop = cache.segments[first:]
        held = sum(s.real_entries for s in loop)
        if held <= self.entries:
            return first
        before = SplicedCache(cache.segments[:first], loop[0].span[0])
        segment = self.compact(HistoryWork(lm, ids, before, History.of(loop), recent, seed), self.entries)
        if segment.real_entries > self.entries + 1e-6:
            raise VkvError(f"compacting the history kept {segment.real_entries:g} entries per head, over the cap")
        held = round(held, 2)
        segment.stats = {**segment.stats, "recompacted": len(loop), "entries_before": held, "cap": self.entries}
        cache.segments[first:] = [segment]
        return first


@dataclass
class Loop:
    """How a running cache's loop meets a span's turns: in chunks of at least `every` tokens (0: each turn), under
    `cap` (None: no cap), the trailing turns within `recent` tokens kept verbatim."""

    every: int = 0
    cap: HistoryCap | None = None
    recent: int = 0

    def split(self, turns: list[Turn]) -> tuple[list[Turn], list[Turn]]:
        """(the chunks to compress, the recent turns kept verbatim)."""
        older, kept = split_recent(turns, self.recent)
        return (chunk_turns(older, self.every) if self.every else older), kept

    def left(self, budget: int | None, chunks: list[Turn], kept: list[Turn]) -> int | None:
        """The entries the chunks share: the budget less the recent tokens kept verbatim (None: each chunk chooses
        its own, auto-ratio)."""
        if budget is None:
            return None
        verbatim = sum(t.length for t in kept)
        if chunks and budget - verbatim < len(chunks):
            raise VkvError(
                f"the {verbatim} recent tokens kept verbatim leave {max(budget - verbatim, 0)} of the budget's {budget} "
                f"entries for {len(chunks)} chunk(s) to compress; keep fewer recent tokens or use a lower ratio"
            )
        return budget - verbatim

    def stats(self, segments: list[Segment]) -> dict:
        """What a run records of its loop: the chunk size, the recent tokens, the cap, and at the end the entries per
        head on average and the most any head holds."""
        stats = {k: v for k, v in (("every", self.every), ("recent", self.recent)) if v}
        if self.cap is not None:
            held = round(sum(s.real_entries for s in segments), 2)
            most = most_entries_per_head(segments)
            stats.update(cap=self.cap.entries, entries_per_head=held, max_entries_per_head=most)
        return stats


def best_entries(
    scores: torch.Tensor, real: torch.Tensor, entries: int, rule: HeadBudget | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The history's best slots by `scores` `[layers, kv_heads, slots]` among the `real` ones, `entries` per head on
    average split over heads by `rule` (compress/head_budget.py; a head keeps at most what it holds, so a rule that
    keeps each head's own count may keep fewer) → (`index` `[layers, kv_heads, t]`, real ones first in slot order,
    padding repeating the head's first; `real` `[layers, kv_heads, t]`)."""
    rule = HeadBudget.of(rule)
    slots = scores.shape[-1]
    masked = scores.float().masked_fill(~real, float("-inf"))
    if rule.moves_entries:
        index, kept = per_head_index(masked, min(entries, slots), rule)
        kept = kept & real.gather(-1, index)  # a head's floor may reach past what it holds
    else:  # each head its own best: once heads hold their own entries, "the same tokens in every head" means nothing
        index = masked.topk(min(entries, slots), dim=-1).indices
        kept = real.gather(-1, index)
    order = torch.where(kept, index, index + slots).sort(-1).values
    t = max(int(kept.sum(-1).max()), 1)
    index, kept = order[..., :t], (order < slots)[..., :t]
    return torch.where(kept, index, index[..., :1]), kept
