"""What a method is given: the span to compress and everything a live agent has when it compresses it, never the
evaluation questions (no field here could carry them); per turn, one message fed on top of the running cache."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from vkv.compress.budget import span_budget
from vkv.compress.turn import Turn, TurnView, view_on_cache
from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, compact_segment, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.attention import attention_weights, query_hooks
from vkv.lm.capture import Activations, capture_span
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM


@dataclass
class Reusing:
    """What a method's work computes once and every run on it shares (`reuse`), with the seconds it took."""

    _reusable: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    reused_seconds: float = field(default=0.0, init=False, repr=False, compare=False)

    def reuse(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """`compute()`, computed once for this work and `key` (which must name everything the result depends on): a
        method run at several ratios shares what does not depend on the ratio, such as the reconstruction pass. Each
        reuse adds the seconds the first computation took to `reused_seconds`, so that a run's compression time
        still counts the work it would have done alone."""
        if key in self._reusable:
            value, seconds = self._reusable[key]
            self.reused_seconds += seconds
            return value
        started = time.perf_counter()
        value = compute()
        self._reusable[key] = (value, time.perf_counter() - started)
        return value

    def has(self, key: tuple) -> bool:
        """Whether `reuse` already holds a result for `key`."""
        return key in self._reusable

    def take_reused_seconds(self) -> float:
        """The seconds of reused work since the last call (and start counting again)."""
        seconds, self.reused_seconds = self.reused_seconds, 0.0
        return seconds


@dataclass
class SpanWork(Reusing):
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

    @classmethod
    def capture(
        cls,
        lm: FrozenLM,
        ids: list[int],
        start: int,
        end: int,
        message_starts: list[int],
        message_roles: list[str] | None = None,
        seed: int = 0,
        attention: torch.Tensor | None = None,
    ) -> SpanWork:
        """What every method is given to compress ids[start:end] of a rendered conversation: one forward pass over the
        text up to the span's end (its K/V, the span's activations), never the questions. The one way a whole span's
        work is built (`vkv eval`, `vkv score`, `vkv.compress`, `compress_span`)."""
        acts, cache = capture_span(lm, ids, start, end, keep_cache=True)
        return cls(
            lm,
            list(ids),
            start,
            end,
            KVPrefix.from_cache(cache),
            acts,
            message_starts,
            seed,
            attention,
            message_roles,
        )

    @property
    def span_length(self) -> int:
        return self.end - self.start

    def budget(self, ratio: float) -> int:
        """Entries a method may keep for the span at this ratio: `span_budget`, the one rule every method uses."""
        return span_budget(self.span_length, ratio)

    def prefix(self) -> KVPrefix:
        """The K/V of everything before the span, as the model holds it when the span is compressed."""
        return self.kv.slice(0, self.start - self.kv_start)

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

    def span_entries(self) -> Segment:
        """The span's own K/V as a verbatim segment: what a read-out pass reads after `prefix_cache()`."""
        return verbatim_segment(self.kv.slice(self.start - self.kv_start, self.end - self.kv_start), self.start)

    def span_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The span's own full-context keys and values, `[layers, kv_heads, span, head_dim]` float32 each."""
        return self.kv.slice(self.start - self.kv_start, self.end - self.kv_start).stacked()

    def keep_per_head(
        self,
        index: torch.Tensor,
        values: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        real: torch.Tensor | None = None,
        keys: torch.Tensor | None = None,
        **stats,
    ) -> Segment:
        """A compact segment (`compact_segment`) of the span's keys at span-relative `index` `[layers, kv_heads, t]`
        (each head its own entries), or of free `keys` `[layers, kv_heads, t, head_dim]` (post-RoPE, standing where
        `index`'s entries stood), with their own values or `values` `[layers, kv_heads, t, head_dim]`, `bias`
        `[layers, kv_heads, t]`, and with `real` `[layers, kv_heads, t]` False on padding slots (head-wise budgets)."""
        span_keys, span_values = self.span_kv()
        gather = index[..., None].expand(-1, -1, -1, span_keys.shape[-1])
        kept_keys = span_keys.gather(2, gather) if keys is None else keys
        kept_values = span_values.gather(2, gather) if values is None else values
        if real is not None:
            stats["head_budget_slots"] = index.shape[-1]  # physical slots per head; the rest of the row is padding
        return compact_segment(
            (self.start, self.end), kept_keys, kept_values, index, real, bias, stats, start=self.start
        )

    def attention_between(self, key_range: tuple[int, int], query_range: tuple[int, int]) -> torch.Tensor:
        """Attention `[layers, kv_heads, key_len]` from the tokens in query_range to those in key_range (absolute
        positions inside the span), as the model computes it for this work's context. Only the query tokens are run
        again, on top of the cached K/V before them (their queries were not kept), not the whole context."""
        (ks, ke), (qs, qe) = key_range, query_range
        if not (self.kv_start <= ks < ke <= qe and self.kv_start <= qs < qe <= self.end):
            raise VkvError(f"attention from tokens [{qs}, {qe}) to [{ks}, {ke}) is not a valid causal range")
        cache = SplicedCache()
        if qs > self.kv_start:
            cache.append(verbatim_segment(self.kv.slice(0, qs - self.kv_start), self.kv_start))
        with query_hooks(self.lm, 0, qe - qs) as queries:
            Context(self.lm, cache).feed(self.ids[qs:qe])
        keys = [k[0] for k in self.kv.slice(0, qe - self.kv_start).keys]
        positions = torch.arange(self.kv_start, qe).float()
        weights = attention_weights(self.lm, queries, torch.arange(qs, qe).float(), keys, positions)
        return weights[:, :, ks - self.kv_start : ke - self.kv_start]


@dataclass
class TurnWork(SpanWork):
    """One message's tokens as the model computed them on top of a running compressed cache (`history`): kv holds
    the message's own entries only, and attention is computed over the history's entries plus the message's."""

    history: SplicedCache = field(default_factory=SplicedCache)

    @classmethod
    def on_cache(cls, work: SpanWork, history: SplicedCache, turn: Turn) -> TurnWork:
        """The turn's tokens fed on top of `history` (which must end where the turn starts), queries kept."""
        return cls.on_view(work, history, turn, view_on_cache(work.lm, history, work.ids, turn, queries=True))

    @classmethod
    def on_view(cls, work: SpanWork, history: SplicedCache, turn: Turn, view: TurnView) -> TurnWork:
        """The turn as `view` holds it, fed on top of `history` (a copy is kept: the running cache grows later)."""
        return cls.fed(work.lm, work.ids, work.message_starts, work.message_roles, work.seed, history, turn, view)

    @classmethod
    def fed(
        cls,
        lm: FrozenLM,
        ids: list[int],
        message_starts: list[int],
        message_roles: list[str],
        seed: int,
        history: SplicedCache,
        turn: Turn,
        view: TurnView,
    ) -> TurnWork:
        """The turn of the conversation `ids` (its messages starting at `message_starts`) as `view` holds it, fed on
        top of `history`; a copy of `history` is kept (the running cache grows later)."""
        return cls(
            lm,
            ids,
            turn.start,
            turn.end,
            view.kv,
            view.acts,
            message_starts,
            seed,
            message_roles=message_roles,
            kv_start=turn.start,
            history=history.fork(),
        )

    def prefix(self) -> KVPrefix:
        return self.lm.prefix(self.history)

    def prefix_cache(self) -> SplicedCache:
        return self.history.fork()

    def attention_between(self, key_range: tuple[int, int], query_range: tuple[int, int]) -> torch.Tensor:
        (ks, ke), (qs, qe) = key_range, query_range
        if not (self.start <= ks < ke <= self.end and self.start <= qs < qe <= self.end):
            raise ValueError(
                f"attention inside a turn: [{qs}, {qe}) → [{ks}, {ke}) leaves the turn [{self.start}, {self.end})"
            )
        keys = [k[0] for k in self.history.kv().cat(self.kv).keys]
        positions = torch.cat(
            [s.positions for s in self.history.segments] + [torch.arange(self.start, self.end).float()]
        )
        bias = self.history.attention_bias()  # the history's entries weigh what the decoding cache weighs them
        if bias is not None:
            bias = torch.cat([bias, torch.zeros(*bias.shape[:2], self.end - self.start)], dim=2)
        queries = [q[:, qs - self.start : qe - self.start] for q in self.acts.queries_pre_rope]
        weights = attention_weights(self.lm, queries, torch.arange(qs, qe).float(), keys, positions, bias)
        offset = self.history.physical_length
        return weights[:, :, offset + ks - self.start : offset + ke - self.start]
