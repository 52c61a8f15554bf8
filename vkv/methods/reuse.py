"""Re-use of a compressed turn on a history that changed under it.

The span's last message is compressed by `method` with the uncompressed history in view, as a running cache does
when the message ends. Later the history is compressed again (everything of the span before that message, by
`history` at `history_ratio`: a session moved, an old turn squeezed harder), and the message's entries join the
new history without being compressed again:

- `carry = "reencode"`: virtual tokens' embeddings run once more on top of the new history (their K/V follow it);
- `carry = "as-is"`: the entries spliced exactly as they were computed (K/V that saw the old history);
- `carry = "fresh"`: the upper bound, the message's tokens fed on the new history and compressed there (methods
  with a budget only: what per-turn compression does).

`history = "verbatim"` keeps the history as it was, so `reencode` and `as-is` must agree there (a test).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from vkv.compress.config import CompressConfig
from vkv.compress.turn import message_turns
from vkv.compress.work import SpanWork, TurnWork
from vkv.errors import VkvError
from vkv.kv.segment import Segment, SegmentGroup
from vkv.kv.spliced import SplicedCache
from vkv.lm.rebuild import virtual_kv
from vkv.methods.base import BudgetMethod, Method
from vkv.settings import setting

CARRIES = ("reencode", "as-is", "fresh")


@dataclass
class ReuseRecipe(CompressConfig):
    """vkv's recipe as reuse runs it: virtual tokens alone by default, since re-encoding carries their embeddings
    (a per-head verbatim share keeps entries that have none; one asked for is refused when re-encoding)."""

    head_verbatim: ClassVar[bool] = False


@dataclass
class Reuse(Method):
    """The span's last message compressed by `method` on the full history, carried onto the rest of the span
    compressed again by `history` at `history_ratio` (re-encoded, as it was, or compressed afresh there)."""

    name = "reuse"
    recipe_class: ClassVar[type] = ReuseRecipe
    method: str = setting("vkv", "what compresses the carried (last) message, at the run's ratio")
    carry: str = setting(
        "reencode", "reencode (virtual tokens only), as-is, or fresh (methods with a budget only)", CARRIES
    )
    history: str = setting("am", "what compresses the rest of the span afterwards, or verbatim (left unchanged)")
    history_ratio: float = setting(4.8, "the ratio the history is compressed at", minimum=1)
    recipe: CompressConfig | None = None  # for a virtual-token `method`: its recipe (None: ReuseRecipe's defaults)

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> SegmentGroup:
        self.check()
        split = _last_message_start(work)
        history = self._compress_history(replace(work, end=split, acts=work.acts.slice(work.start, split)))
        cache = work.prefix_cache()
        for segment in history:
            cache.append(segment)
        carried_work = replace(work, start=split, acts=work.acts.slice(split, work.end))
        if self.carry == "fresh":
            turn = message_turns(work.message_starts, work.message_roles, split, work.end)[0]
            turn_work = TurnWork.on_cache(work, cache, turn)
            carried = self._method().compress_to(turn_work, turn_work.budget(ratio))
        else:
            carried = self._method().compress(carried_work, ratio, on_step)
            if self.carry == "reencode":
                carried = _reencoded(work, carried, cache)
        stats = {"history": self.history, "history_ratio": self.history_ratio, "carry": self.carry, "split": split}
        return SegmentGroup([*history, carried], stats)

    def check(self) -> None:
        from vkv.methods import METHODS  # cycle: the registry imports this module

        super().check()
        for field, value in (("method", self.method), ("history", self.history)):
            if value not in METHODS and not (field == "history" and value == "verbatim"):
                raise VkvError(f"reuse: field {field}: unknown method '{value}'")
        if self.carry == "fresh" and not issubclass(METHODS[self.method], BudgetMethod):
            raise VkvError(
                f"reuse: carry 'fresh' is implemented for methods with a budget (am, kvzip, knorm, …), not "
                f"'{self.method}'"
            )

    def _method(self) -> Method:
        from vkv.methods import get_method  # cycle: the registry imports this module

        return get_method(self.method, recipe=self._recipe())

    def _recipe(self) -> CompressConfig | None:
        """The recipe a virtual-token `method` runs (None for any other method)."""
        return ReuseRecipe.of(self.recipe).validate() if self.method in ("vkv", "meanpool") else None

    def _compress_history(self, work: SpanWork) -> list[Segment]:
        if self.history == "verbatim":
            return [work.keep(list(range(work.span_length)))]
        from vkv.methods import get_method  # cycle: the registry imports this module

        result = get_method(self.history).compress(work, self.history_ratio)
        if result is None:
            return []
        return list(result) if isinstance(result, SegmentGroup) else [result]

    def config(self) -> dict:
        recipe = self._recipe()
        fields = {k: v for k, v in super().config().items() if k != "recipe"}
        return fields | {"recipe": None if recipe is None else recipe.to_dict()}


def _last_message_start(work: SpanWork) -> int:
    """Where the span's last message starts; refused when the span holds one message only."""
    starts = [s for s in work.message_starts if work.start < s < work.end]
    if not starts:
        raise VkvError(
            f"reuse: the span [{work.start}, {work.end}) holds one message; it needs a history before the message "
            "it carries (choose a window of two or more messages)"
        )
    return starts[-1]


def _reencoded(work: SpanWork, segment: Segment, history: SplicedCache) -> Segment:
    """A virtual segment's embeddings run once more at their positions on top of `history`."""
    if segment.kind != "virtual" or segment.embeddings is None:
        raise VkvError(
            f"reuse: carry 'reencode' needs virtual tokens (their embeddings); '{segment.kind}' entries have none: "
            "use carry 'as-is' or 'fresh'"
        )
    lm = work.lm
    keys, values = virtual_kv(lm, segment.embeddings, segment.positions, lm.prefix(history))
    return replace(segment, keys=keys, values=values)  # every other field as it was
