"""The one interface every context-compression method implements (`Method.compress(work, ratio, on_step)`), and the
base classes that own what methods share: the ratio's budget, the per-turn setting, option checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from vkv.compress.history import HistoryCap, HistoryWork, Loop
from vkv.compress.turn import Turn
from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.kv.segment import Segment, SegmentGroup
from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM
from vkv.methods.turns import compress_messages, compress_per_turn
from vkv.methods.work import TextWork
from vkv.settings import check_value, flat_settings, setting

LATER_LOOP_FIELDS = ("every", "cap", "recent")  # recorded only where set


@dataclass
class Method:
    """A KV-level method. Its options are the dataclass fields of its class, each with its default; `compress`
    returns the segment (or group of segments, in span order) standing for the span, or None to drop it."""

    name: ClassVar[str]
    uses_ratio: ClassVar[bool] = True
    reference: ClassVar[bool] = False  # full and none: the harness measures them once per window
    reports_steps: ClassVar[bool] = False  # calls on_step(step, loss) while it optimises
    recipe_class: ClassVar[type | None] = None  # the config its `recipe` option takes, whose settings are flags and
    # top-level sweep keys (vkv's VkvRecipe)

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.init)

    @property
    def question_aware(self) -> bool:
        """Whether it was given what no live agent has (an evaluation question)."""
        return False

    @property
    def chooses_ratio(self) -> bool:
        """Whether the method chooses each turn's ratio itself, so that it is given none (vkv's auto-ratio)."""
        return False

    def compress(
        self, work: SpanWork, ratio: float, on_step: Callable[[int, float], None] | None = None
    ) -> Segment | SegmentGroup | None:
        raise NotImplementedError

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise VkvError on an option outside its declared type, choices or range, as the method is built and again
        before any work is done: the check sweeps and the command line make, `settings.check_value`, which also gives
        each option the form it is held in (a head budget's name becomes its HeadBudget)."""
        for s in flat_settings(type(self)):
            setattr(self, s.key, check_value(s, getattr(self, s.key), f"{self.name}: "))

    def config(self) -> dict[str, Any]:
        """Every option with its effective value: what the run's identity and results record."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Method:
        """The method `config()` recorded (a saved session's)."""
        return cls(**config)


@dataclass
class BudgetMethod(Method):
    """A method that keeps a budget of entries for the span: `compress_to(work, budget, on_step)` is the method. This
    class turns the ratio into the budget by the rule every method shares (`SpanWork.budget`)."""

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> Segment | SegmentGroup:
        self.check()
        return self.compress_to(work, work.budget(ratio), on_step)

    def compress_to(self, work: SpanWork, budget: int, on_step=None) -> Segment | SegmentGroup:
        raise NotImplementedError


@dataclass
class PerTurnMethod(BudgetMethod):
    """A budget method that can also run as an agent's loop, on top of the running compressed cache
    (methods/turns.py): each message when it ends (`per_turn`), or chunks of at least `every` tokens of messages, the
    span's budget shared over them in proportion to their lengths; under a `cap`, the history is compacted again by
    the method's own rule (`compact_history`) whenever some head would hold more."""

    per_turn: bool = setting(False, "compress each message when it ends, on top of the running compressed cache")
    every: int = setting(
        0,
        "compress in chunks: whenever this many tokens of new messages have accumulated, together, on top of the "
        "running compressed cache (0: off)",
        minimum=0,
    )
    cap: int = setting(
        0,
        "entries per KV head (on average, as a ratio counts them) the compressed history never exceeds: when a "
        "message or chunk would take it past, the history is compacted again (needs per_turn or every; 0: no cap)",
        minimum=0,
    )
    recent: int = setting(
        0,
        "tokens at the end of the span kept verbatim, as agents keep their recent turns: messages that start within "
        "them are not compressed, and their tokens count against the budget (needs per_turn or every; 0: none)",
        minimum=0,
    )

    def config(self) -> dict[str, Any]:
        return {**{k: v for k, v in super().config().items() if k not in LATER_LOOP_FIELDS}, **self.loop_config()}

    def loop_config(self) -> dict[str, Any]:
        """`per_turn`, and the loop's later fields where set: runs recorded before them keep their ids."""
        return {"per_turn": self.per_turn, **{k: getattr(self, k) for k in LATER_LOOP_FIELDS if getattr(self, k)}}

    @property
    def looped(self) -> bool:
        """Whether the span is compressed as a loop of messages or chunks rather than at once."""
        return self.per_turn or self.every > 0

    def check(self) -> None:
        super().check()
        if self.cap and not self.looped:
            raise VkvError(f"{self.name}: a cap bounds a running cache; set per_turn or every as well")
        if self.recent and not self.looped:
            raise VkvError(f"{self.name}: recent tokens are kept by a running cache's loop; set per_turn or every")
        if self.per_turn and self.every:
            raise VkvError(
                f"{self.name}: per_turn (each message) and every (chunks of messages) are two loops; set one"
            )

    def history_cap(self) -> HistoryCap | None:
        """The loop's cap with this method's rule for compacting its history, or None without a cap."""
        return HistoryCap(self.cap, self.compact_history) if self.cap else None

    def compact_history(self, work: HistoryWork, entries: int) -> Segment:
        """The history's entries compacted again to at most `entries` per layer and KV head (`work`: the history,
        the cache before it, its text and the newest chunk)."""
        raise VkvError(
            f"{self.name} has no rule for compacting its own entries again, so it cannot run under a cap; methods "
            f"that can: {', '.join(capped_methods())}"
        )

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> Segment | SegmentGroup:
        if not self.looped:
            return super().compress(work, ratio, on_step)
        self.check()
        return compress_per_turn(work, work.budget(ratio), self)

    def compress_messages(
        self,
        lm: FrozenLM,
        ids: list[int],
        turns: list[Turn],
        cache: SplicedCache,
        budget: int,
        message_starts: list[int],
        message_roles: list[str],
        seed: int = 0,
        on_turn: Callable[[Turn, Segment], None] | None = None,
    ) -> list[Segment]:
        """`turns` (messages) compressed one at a time, or in chunks of `every` tokens, on the running `cache` (which
        ends where the first starts), the `budget` shared over them in proportion to their lengths, under the cap if
        any: what `Session.compress` runs."""
        self.check()
        starts, roles = message_starts, message_roles
        return compress_messages(
            lm, ids, turns, cache, budget, starts, roles, seed, self.compress_to, on_turn, self.loop()
        )

    def loop(self) -> Loop:
        """How the method's loop runs: its chunks, cap and recent tokens."""
        return Loop(self.every, self.history_cap(), self.recent)


def capped_methods() -> list[str]:
    """The registered methods that can run under a cap (their own `compact_history`)."""
    from vkv.methods import METHODS  # the registry imports every method module, this one first

    return [
        name
        for name, cls in METHODS.items()
        if issubclass(cls, PerTurnMethod) and cls.compact_history is not PerTurnMethod.compact_history
    ]


@dataclass
class TextMethod(Method):
    """A text-level method: returns each span message's pruned content; the harness re-renders and prefills
    the shorter conversation and measures the achieved ratio with the generator's tokenizer.

    With `query_aware=True` the harness prunes once per evaluation question, with the question as the query:
    an upper bound that no live agent has, reported with `question_aware: true`."""

    query_aware: bool = setting(
        False,
        "prune once per evaluation question with the question as the query (an upper bound, reported as "
        "question-aware)",
    )
    per_turn: bool = setting(False, "prune each message when it ends, with the request known then")

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
