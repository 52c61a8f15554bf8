"""Per-turn compression of vkv's virtual tokens: each turn becomes its own segment, appended to a running cache.

Turn by turn, in order, the virtual tokens of a turn are optimised and their K/V computed on top of the
running compressed cache (the entries that will precede them when the cache is used), so each virtual entry
was computed with exactly the entries before it in view. What they are matched to is selectable:

- `oracle`: the turn's V as the model computes it with the full uncompressed history (what the seed did);
- `online`: the turn's V computed by feeding its real tokens on top of the running compressed cache (all a
  live agent has: it never needs the uncompressed history).

Entries a turn keeps verbatim (its per-turn verbatim share; a turn no auto-ratio rung could compress) carry the K/V of
the same view the targets come from. Each turn's segment records its loss and, when the full history is
known, its target drift: how far the turn's V on top of the compressed history is from its V on top of the
full one (variance-normalised MSE, averaged over layers). Loss that grows turn after turn is error
accumulation; growing drift is the targets themselves moving as compressed context accumulates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vkv.compress.autoratio import choose_ratio, segment_loss
from vkv.compress.budget import allocate
from vkv.compress.history import HistoryCap
from vkv.compress.problem import needs_queries
from vkv.compress.recipe import VkvRecipe, recipe_segment
from vkv.compress.turn import Turn, TurnView, view_on_cache
from vkv.compress.work import TurnWork
from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.capture import Activations, capture_span
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM


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


# ---- the loop --------------------------------------------------------------------------------------


def turn_stats(turn: Turn) -> dict[str, Any]:
    return {"turn": turn.label, "role": turn.role}


def compress_turns(
    lm: FrozenLM,
    ids: list[int],
    turns: list[Turn],
    cache: SplicedCache,
    budgets: list[int],
    compress_turn: Callable[[SplicedCache, Turn, TurnView, int], Segment],
    queries: bool = False,
    on_turn: Callable[[Turn, Segment], None] | None = None,
    cap: HistoryCap | None = None,
    seed: int = 0,
) -> list[Segment]:
    """The running-cache loop every turn-by-turn compression runs (vkv's and each per-turn method's): turn after turn,
    its real tokens are fed on top of `cache` (which must end where the first turn starts; with `queries`, their
    pre-RoPE queries kept too), `compress_turn(cache, turn, view, budget)` gives its segment, and the segment joins
    `cache` before the next turn is fed. Under a `cap`, the loop's segments are compacted again whenever some head
    would hold more (compress/history.py). Returns the loop's segments as the cache holds them at the end."""
    first = len(cache.segments)
    for turn, budget in zip(turns, budgets):
        view = view_on_cache(lm, cache, ids, turn, queries or cap is not None)
        segment = compress_turn(cache, turn, view, budget)
        segment.stats = {**segment.stats, **turn_stats(turn)}
        cache.append(segment)
        if cap is not None:
            first = cap.hold(lm, ids, cache, first, view, seed)
        if on_turn is not None:
            on_turn(turn, segment)
    return cache.segments[first:]


def compress_virtual_turns(
    lm: FrozenLM,
    ids: list[int],
    turns: list[Turn],
    cache: SplicedCache,
    config: VkvRecipe,
    budget: int | None,
    history: FullHistory | None = None,
    message_starts: list[int] | None = None,
    on_turn: Callable[[Turn, Segment], None] | None = None,
    cap: HistoryCap | None = None,
) -> list[Segment]:
    """vkv's turn-by-turn compression: `budget` entries (`span_budget` of the turns' tokens) shared over `turns` in
    proportion to their lengths, or each turn's own by auto-ratio (then `budget` is None), appended to `cache`.

    `history` (the uncompressed conversation over the turns) is required for oracle targets and gives the target
    drift in either mode. `config`: a validated recipe (`VkvRecipe.validate`)."""
    config.check_turn_by_turn()
    oracle_targets = config.target_source == "oracle"
    if oracle_targets and history is None:
        raise VkvError("oracle targets need the full uncompressed history; use online targets without it")
    if config.auto_ratio:
        budgets = [0] * len(turns)
    elif budget is None:
        raise VkvError("turn-by-turn compression needs a ratio unless auto_ratio chooses one per turn")
    else:
        budgets = allocate([t.length for t in turns], budget)
    queries = needs_queries(config.compress)
    if oracle_targets and queries:  # online targets read only the history's V
        history = history.with_queries(lm, ids)

    def compress_turn(running: SplicedCache, turn: Turn, online: TurnView, entries: int) -> Segment:
        oracle = history.view(turn) if history is not None else None
        view = oracle if oracle_targets else online
        segment = _turn_segment(lm, ids, turn, view, running, entries, config, message_starts)
        segment.stats.update(
            targets=config.target_source,
            loss=segment_loss(segment),
            drift=None if oracle is None else target_drift(online, oracle),
        )
        return segment

    return compress_turns(
        lm, ids, turns, cache, budgets, compress_turn, queries, on_turn, cap, config.compress.optim.seed
    )


def _turn_segment(
    lm, ids, turn: Turn, view: TurnView, running: SplicedCache, budget: int, config: VkvRecipe, message_starts
) -> Segment:
    """The turn's segment on top of the running cache it will be used in (its scores read out there too), at
    `budget` entries, or at the ratio auto-ratio chooses for it."""
    work = TurnWork.fed(lm, ids, message_starts, None, config.compress.optim.seed, running, turn, view)
    if config.auto_ratio:
        return choose_ratio(
            turn.length, lambda entries: recipe_segment(work, config, entries), view.verbatim, config.tolerance
        )
    return recipe_segment(work, config, budget)
