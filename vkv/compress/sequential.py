"""Sequential multi-turn compression: each turn becomes its own segment, appended to a running cache.

Turn by turn, in order, the virtual tokens of a turn are optimised and their K/V computed on top of the
running compressed cache (the entries that will precede them when the cache is used), so each virtual entry
was computed with exactly the entries before it in view. What they are matched to is selectable:

- `oracle`: the turn's V as the model computes it with the full uncompressed history (what the seed did);
- `online`: the turn's V computed by feeding its real tokens on top of the running compressed cache (all a
  live agent has: it never needs the uncompressed history).

Entries a turn keeps verbatim (hybrid tokens; a turn no auto-ratio rung could compress) carry the K/V of
the same view the targets come from. Each turn's segment records its loss and, when the full history is
known, its target drift: how far the turn's V on top of the compressed history is from its V on top of the
full one (variance-normalised MSE, averaged over layers). Loss that grows turn after turn is error
accumulation; growing drift is the targets themselves moving as compressed context accumulates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from vkv.compress.autoratio import AutoRatioConfig, choose_ratio, record_loss, segment_loss
from vkv.compress.config import CompressConfig
from vkv.compress.hybrid import HybridConfig, hybrid_segment
from vkv.compress.pooling import span_budget
from vkv.compress.problem import SpanProblem, needs_queries
from vkv.compress.single import virtual_segment
from vkv.compress.targets import Targets, target_kind
from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.capture import Activations, capture_span, projection_hooks
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM

TARGET_MODES = ("oracle", "online")


@dataclass
class MultiTurnConfig:
    """How each turn is compressed: the core settings plus target mode, hybrid verbatim share, auto-ratio."""

    compress: CompressConfig = field(default_factory=CompressConfig)
    targets: str = "oracle"
    hybrid: HybridConfig | None = None
    auto_ratio: AutoRatioConfig | None = None

    def validate(self) -> MultiTurnConfig:
        if self.targets not in TARGET_MODES:
            raise VkvError(
                f"unknown target source (--target-source) '{self.targets}'; choose one of {', '.join(TARGET_MODES)}"
            )
        if self.compress.pooling == "attention":
            raise VkvError("attention pooling needs a question, so sequential compression cannot use it")
        if target_kind(self.compress.target).needs_queries:  # online targets would need the turn's queries
            raise VkvError(
                f"target {self.compress.target} is not implemented for sequential compression; use v or kv-pre-rope"
            )
        self.compress.optim.validate()
        if self.hybrid is not None:
            self.hybrid.validate()
        if self.auto_ratio is not None:
            self.auto_ratio.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "compress": self.compress.to_dict(),
            "targets": self.targets,
            "hybrid": None if self.hybrid is None else self.hybrid.to_dict(),
            "auto_ratio": None if self.auto_ratio is None else self.auto_ratio.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MultiTurnConfig:
        unknown = set(d) - {"compress", "targets", "hybrid", "auto_ratio"}
        if unknown:
            raise VkvError(f"unknown multi-turn setting(s): {', '.join(sorted(unknown))}")
        return cls(
            compress=CompressConfig.from_dict(d.get("compress", {})),
            targets=d.get("targets", "oracle"),
            hybrid=None if d.get("hybrid") is None else HybridConfig.from_dict(d["hybrid"]),
            auto_ratio=None if d.get("auto_ratio") is None else AutoRatioConfig.from_dict(d["auto_ratio"]),
        ).validate()


@dataclass(frozen=True)
class Turn:
    """Messages [first, last) of a conversation occupying token ids [start, end)."""

    first: int
    last: int
    role: str | None
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def label(self) -> str:
        return str(self.first) if self.last == self.first + 1 else f"{self.first}-{self.last - 1}"


def message_turns(message_starts: list[int], roles: list[str] | None, start: int, end: int) -> list[Turn]:
    """One Turn per message overlapping token range [start, end) (the first may begin at `start`)."""
    turns = []
    for i, s in enumerate(message_starts):
        e = message_starts[i + 1] if i + 1 < len(message_starts) else None
        lo, hi = max(s, start), min(e if e is not None else end, end)
        if lo < hi:
            turns.append(Turn(i, i + 1, roles[i] if roles else None, lo, hi))
    return turns


# ---- what the model computes for a turn's real tokens --------------------------------------------


@dataclass
class TurnView:
    """A turn's real tokens as the model computed them on top of some history."""

    acts: Activations  # V, pre-RoPE K and surprisal over [start, end)
    kv: KVPrefix  # the turn's own K/V, `[1, kv_heads, length, head_dim]` per layer

    def verbatim(self) -> Segment:
        return verbatim_segment(self.kv, self.acts.start)


class FullHistory:
    """The uncompressed conversation: activations over [acts.start, acts.end) and K/V of every token before."""

    def __init__(self, acts: Activations, kv: KVPrefix):
        self.acts, self.kv = acts, kv

    @classmethod
    def capture(cls, lm: FrozenLM, ids: list[int], start: int, end: int) -> FullHistory:
        acts, cache = capture_span(lm, ids, start, end, keep_cache=True)
        return cls(acts, KVPrefix.from_cache(cache))

    def view(self, turn: Turn) -> TurnView:
        if not self.acts.start <= turn.start < turn.end <= self.acts.end:
            raise VkvError(
                f"tokens {turn.start}-{turn.end} lie outside the captured history {self.acts.start}-{self.acts.end}"
            )
        return TurnView(self.acts.slice(turn.start, turn.end), self.kv.slice(turn.start, turn.end))

    def with_queries(self, lm: FrozenLM, ids: list[int]) -> FullHistory:
        """The same history with the span's pre-RoPE queries (one forward over the text up to its end), so that turn
        problems that read them do not each run their own."""
        if self.acts.queries_pre_rope is not None:
            return self
        acts, _ = capture_span(lm, ids[: self.acts.end], self.acts.start, self.acts.end, queries=True)
        return FullHistory(acts, self.kv)

    def verbatim(self, turn: Turn) -> Segment:
        """The turn's exact full-context K/V (for turns kept as they are)."""
        segment = verbatim_segment(self.kv.slice(turn.start, turn.end), turn.start)
        segment.stats = turn_stats(turn)
        return segment


def view_on_cache(lm: FrozenLM, cache: SplicedCache, ids: list[int], turn: Turn, queries: bool = False) -> TurnView:
    """Feed the turn's real tokens on top of the running cache (not changing it) and record what they give
    (with `queries`, the turn's pre-RoPE queries too)."""
    if cache.next_position != turn.start:
        raise VkvError(
            f"the running cache ends at position {cache.next_position}, not at the turn's start {turn.start}"
        )
    context = Context(lm, cache)
    with projection_hooks(lm, 0, turn.length, queries) as store:
        logits = context.feed(ids[turn.start : turn.end])
    turn_ids = torch.tensor(ids[turn.start : turn.end])
    nll = -torch.log_softmax(logits[:-1], -1).gather(-1, turn_ids[1:, None].to(logits.device))[:, 0].cpu()
    surprisal = torch.cat([torch.full((1,), float("nan")), nll])  # the first token's predictor is not kept
    values, keys = torch.stack(store["values"]), torch.stack(store["keys_pre_rope"])
    acts = Activations(
        values, keys, surprisal, turn.start, turn.end, torch.stack(store["queries_pre_rope"]) if queries else None
    )
    return TurnView(acts, context.cache.fed())


def append_verbatim(lm: FrozenLM, cache: SplicedCache, ids: list[int], turns: list[Turn]) -> None:
    """Append turns as verbatim segments, each computed on top of everything before it (one cache copy)."""
    if not turns:
        return
    context = Context(lm, cache)
    for turn in turns:
        if context.position != turn.start:
            raise VkvError(
                f"turn {turn.label} starts at token {turn.start}, but the cache continues at {context.position}"
            )
        before = context.length
        context.feed(ids[turn.start : turn.end])
        segment = verbatim_segment(context.cache.fed(before), turn.start)
        segment.stats = turn_stats(turn)
        cache.append(segment)


def target_drift(online: TurnView, oracle: TurnView) -> float:
    """Variance-normalised MSE between a turn's V on the compressed history and on the full one, layer mean."""
    a, b = online.acts.values.float(), oracle.acts.values.float().to(online.acts.values.device)
    per_layer = (a - b).pow(2).mean(dim=(1, 2, 3)) / b.reshape(b.shape[0], -1).var(dim=1).clamp_min(1e-8)
    return float(per_layer.mean())


# ---- budgets ---------------------------------------------------------------------------------------


def allocate(lengths: list[int], ratio: float) -> list[int]:
    """Entries per turn: the span's total budget (the rounding every method uses) shared in proportion to the
    turns' lengths by largest remainder, at least one entry and at most the turn's length each."""
    total = span_budget(sum(lengths), ratio)
    if total < len(lengths):
        raise VkvError(
            f"ratio {ratio} leaves {total} entries for {len(lengths)} turns, and each turn needs one; "
            "lower the ratio or compress fewer, longer turns"
        )
    quotas = [length * total / sum(lengths) for length in lengths]
    counts = [max(1, min(length, int(q))) for length, q in zip(lengths, quotas)]
    while sum(counts) != total:
        grow = sum(counts) < total
        movable = [i for i, (c, n) in enumerate(zip(counts, lengths)) if (c < n if grow else c > 1)]
        by_remainder = sorted(movable, key=lambda i: quotas[i] - counts[i], reverse=grow)
        counts[by_remainder[0]] += 1 if grow else -1
    return counts


# ---- the loop --------------------------------------------------------------------------------------


def turn_stats(turn: Turn) -> dict[str, Any]:
    return {"turn": turn.label, "role": turn.role}


def compress_turns(
    lm: FrozenLM,
    ids: list[int],
    turns: list[Turn],
    cache: SplicedCache,
    config: MultiTurnConfig,
    history: FullHistory | None = None,
    message_starts: list[int] | None = None,
    on_turn: Callable[[Turn, Segment], None] | None = None,
) -> list[Segment]:
    """Compress `turns` in order, appending each segment to `cache` (which must end where the first starts).

    `history` (the uncompressed conversation over the turns) is required for oracle targets and gives the
    target drift in either mode. Budgets: the ratio's total shared over the turns, or per turn by auto-ratio.
    """
    config.validate()
    if config.targets == "oracle" and history is None:
        raise VkvError("oracle targets need the full uncompressed history; use online targets without it")
    budgets = (
        [0] * len(turns)
        if config.auto_ratio is not None
        else allocate([t.length for t in turns], config.compress.ratio)
    )
    if config.targets == "oracle" and needs_queries(config.compress):  # online targets read only the history's V
        history = history.with_queries(lm, ids)
    segments = []
    for turn, budget in zip(turns, budgets):
        online = view_on_cache(lm, cache, ids, turn, queries=needs_queries(config.compress))
        oracle = history.view(turn) if history is not None else None
        view = oracle if config.targets == "oracle" else online
        segment = _turn_segment(lm, ids, turn, view, lm.prefix(cache), budget, config, message_starts)
        segment.stats.update(
            turn_stats(turn),
            targets=config.targets,
            loss=segment_loss(segment),
            drift=None if oracle is None else target_drift(online, oracle),
        )
        cache.append(segment)
        segments.append(segment)
        if on_turn is not None:
            on_turn(turn, segment)
    return segments


def turn_targets(
    lm: FrozenLM,
    ids: list[int],
    acts: Activations,
    k: int,
    config: CompressConfig,
    message_starts: list[int] | None,
) -> Targets:
    """The targets of `virtual_segment`'s k virtual tokens, rebuilt (deterministically) to measure its V loss."""
    return SpanProblem.build(lm, ids, acts, k, config, message_starts).targets


def _turn_segment(
    lm, ids, turn: Turn, view: TurnView, prefix: KVPrefix, budget: int, config: MultiTurnConfig, message_starts
) -> Segment:
    def build(entries: int) -> Segment:
        if config.hybrid is not None:
            return hybrid_segment(
                lm, ids, view.acts, view.kv, prefix, entries, config.compress, config.hybrid, message_starts
            )
        exact = replace(config.compress, ratio=turn.length / entries)  # rounds back to exactly `entries`
        segment = virtual_segment(lm, ids, view.acts, prefix, exact, message_starts)
        k = exact.virtual_tokens(entries, turn.length)  # with head-wise shares, more tokens than heads reach
        return record_loss(segment, segment.values, turn_targets(lm, ids, view.acts, k, exact, message_starts))

    if config.auto_ratio is not None:
        return choose_ratio(turn.length, build, view.verbatim, config.auto_ratio)
    return build(budget)
