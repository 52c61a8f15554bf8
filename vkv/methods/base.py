"""The one interface every context-compression method implements, and what it is given.

A method sees the rendered conversation and the span to compress, never the evaluation questions: the
`SpanWork` it receives has no field that could carry them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from vkv.compress.pooling import span_budget
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, SegmentGroup, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.capture import Activations
from vkv.lm.frozen import FrozenLM


@dataclass
class SpanWork:
    """Everything a method may use to compress ids[start:end] (computed once per transcript)."""

    lm: FrozenLM
    ids: list[int]  # the rendered conversation, without any question
    start: int
    end: int
    kv: KVPrefix  # full-context K/V of ids[:end], `[1, kv_heads, end, head_dim]` per layer
    acts: Activations  # the span's V, pre-RoPE K and surprisal
    message_starts: list[int]
    seed: int = 0
    attention: torch.Tensor | None = None  # only for explicitly question-aware variants
    message_roles: list[str] | None = None  # role of each message, parallel to message_starts
    kv_start: int = 0  # the position of kv's first entry (0: kv holds every token before `end`)

    @property
    def span_length(self) -> int:
        return self.end - self.start

    def budget(self, ratio: float) -> int:
        """Entries a method may keep for the span at this ratio (the same rounding for every method)."""
        return span_budget(self.span_length, ratio)

    def keep(self, relative: torch.Tensor | list[int]) -> Segment:
        """Verbatim segment of the span's tokens at these span-relative indices, at their original positions."""
        idx = torch.as_tensor(relative, dtype=torch.long).sort().values + self.start
        rows = idx - self.kv_start
        keys, values = self.kv.select(rows).stacked()
        return Segment("verbatim", (self.start, self.end), keys, values, idx.float())

    def prefix_cache(self) -> SplicedCache:
        """Everything before the span as the model holds it when the span is compressed (a fresh copy to extend):
        here the verbatim context; per turn, the running compressed cache."""
        cache = SplicedCache()
        if self.start > 0:
            cache.append(verbatim_segment(self.kv.slice(0, self.start - self.kv_start), 0))
        return cache

    def span_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The span's own full-context keys and values, `[layers, kv_heads, span, head_dim]` float32 each."""
        return self.kv.slice(self.start - self.kv_start, self.end - self.kv_start).stacked()

    def keep_per_head(
        self,
        index: torch.Tensor,
        values: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        real: torch.Tensor | None = None,
        **stats,
    ) -> Segment:
        """A compact segment of the span's keys at span-relative `index` `[layers, kv_heads, t]` (each head its
        own entries), with their own values or `values` `[layers, kv_heads, t, head_dim]`, and `bias`
        `[layers, kv_heads, t]`. With `real` `[layers, kv_heads, t]` (head-wise budgets: each head's real slots
        first), slots that are False are padding, copies of the head's first entry masked by a bias of −inf.
        Entry j's position is the mean original position of the j-th real entries of every head."""
        from vkv.kv.segment import MASKED

        keys, span_values = self.span_kv()
        gather = index[..., None].expand(-1, -1, -1, keys.shape[-1])
        kept_keys = keys.gather(2, gather)
        kept_values = span_values.gather(2, gather) if values is None else values
        if real is None:
            positions = index.float().mean(dim=(0, 1))
        else:
            bias = (torch.zeros(index.shape) if bias is None else bias).masked_fill(~real, MASKED)
            # padding is a copy of its head's first entry, as cache files restore it (kv/file.py)
            kept_keys, kept_values = (torch.where(real[..., None], t, t[:, :, :1]) for t in (kept_keys, kept_values))
            positions = (index * real).sum(dim=(0, 1)) / real.sum(dim=(0, 1)).clamp_min(1)
            stats["head_budget_slots"] = index.shape[-1]  # physical slots per head; the rest of the row is padding
        return Segment(
            "compact",
            (self.start, self.end),
            kept_keys,
            kept_values,
            positions.float() + self.start,
            bias=bias,
            stats=stats,
        )

    def attention_between(self, key_range: tuple[int, int], query_range: tuple[int, int]) -> torch.Tensor:
        """Attention `[layers, kv_heads, key_len]` from the tokens in query_range to those in key_range (absolute
        positions inside the span), as the model computes it for this work's context."""
        from vkv.lm.attention import attention_to_span

        return attention_to_span(self.lm, self.ids[: self.end], key_range, query_range)


@dataclass
class Method:
    """A KV-level method. Its options are the dataclass fields of its class, each with its default; `compress`
    returns the segment (or group of segments, in span order) standing for the span, or None to drop it."""

    name: ClassVar[str]
    uses_ratio: ClassVar[bool] = True
    reference: ClassVar[bool] = False  # full and none: the harness measures them once per window
    reports_steps: ClassVar[bool] = False  # calls on_step(step, loss) while it optimises

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.init)

    @property
    def question_aware(self) -> bool:
        """Whether it was given what no live agent has (an evaluation question)."""
        return False

    def compress(
        self, work: SpanWork, ratio: float, on_step: Callable[[int, float], None] | None = None
    ) -> Segment | SegmentGroup | None:
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """Every option with its effective value: what the run's identity and results record."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}


@dataclass
class BudgetMethod(Method):
    """A method that keeps a budget of entries for a span: `compress_to(work, budget)` is the method; this class
    owns the ratio → budget rule and the per-turn setting (methods/turns.py)."""

    per_turn: bool = False  # compress each message when it ends, on top of the running compressed cache

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> Segment | SegmentGroup:
        self.check()
        if self.per_turn:
            from vkv.methods.turns import compress_per_turn

            return compress_per_turn(work, ratio, self.compress_to)
        return self.compress_to(work, work.budget(ratio))

    def check(self) -> None:
        """Raise VkvError on an option value the method does not know (before any work is done)."""

    def compress_to(self, work: SpanWork, budget: int) -> Segment:
        raise NotImplementedError


@dataclass
class TextWork:
    """What a text-level method may use: the span's messages and a question-agnostic query."""

    lm: FrozenLM
    messages: list  # the span's Message objects, in order
    query: str  # the conversation's most recent user request, never an evaluation question


@dataclass
class TextMethod(Method):
    """A text-level method: returns each span message's pruned content; the harness re-renders and prefills
    the shorter conversation and measures the achieved ratio with the generator's tokenizer.

    With `query_aware=True` the harness prunes once per evaluation question, with the question as the query:
    an upper bound that no live agent has, reported with `question_aware: true`."""

    query_aware: bool = False
    per_turn: bool = False  # prune each message when it ends, with the request known then

    @property
    def question_aware(self) -> bool:
        return self.query_aware

    def prune(self, work: TextWork, ratio: float) -> list[str]:
        raise NotImplementedError

    def prune_span(self, lm: FrozenLM, messages: list, queries: list[str], ratio: float) -> list[str]:
        """Each span message's pruned content. `queries[i]` is the query known when message i ends; the span is
        pruned at once for the last one, or with `per_turn=True` each message on its own when it ends, with
        the query of that moment (the text analogue of per-turn eviction)."""
        if self.per_turn:
            return [self.prune(TextWork(lm, [m], q), ratio)[0] for m, q in zip(messages, queries)]
        return self.prune(TextWork(lm, messages, queries[-1]), ratio)
