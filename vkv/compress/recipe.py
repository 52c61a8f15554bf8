"""vkv's recipe, and the one pipeline that runs it on a span or a turn: the verbatim part, decided here alone, then the
virtual tokens beside it.

The verbatim part is any of: none; `shared`, one set of the span's tokens every head keeps (compress/hybrid.py);
`per-head`, each KV head its own entries, the span's best by kvzip's reconstruction importance or am's compaction
(compress/head_hybrid.py); or `shared+per-head`, both: the shared tokens first, then each head's own among the rest.
The virtual tokens are built once (`virtual_segment`) for whatever the verbatim part leaves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from vkv import upgrade
from vkv.compress.autoratio import AutoRatioConfig
from vkv.compress.config import CompressConfig
from vkv.compress.hybrid import HybridConfig, HybridRecipe, hybrid_segment
from vkv.compress.reconstruction import reconstruction_scores
from vkv.compress.single import fitted_verbatim, virtual_segment
from vkv.compress.targets import target_kind
from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.kv.segment import Segment
from vkv.settings import Config, nested, setting

TARGET_MODES = ("oracle", "online")
VERBATIM_MODES = ("none", "per-head", "shared", "shared+per-head")


@dataclass
class VkvRecipe(Config):
    """vkv's recipe: how its virtual tokens are made (`compress`), the verbatim part they sit beside, where a
    per-turn run's targets come from, and auto-ratio's tolerance. `validate` decides the verbatim mode, the one place
    it is decided; `shared_tokens` and `per_head` are what the rest of the code asks of it."""

    compress: CompressConfig = nested(CompressConfig)
    verbatim: str | None = setting(
        None,
        "the verbatim part beside the virtual tokens: per-head (each KV head keeps its own share of the budget as "
        "entries fitted or chosen by --verbatim-source, --verbatim-share), shared (one set of tokens every head keeps, "
        "--verbatim-fraction, --verbatim-keep-by), shared+per-head (the shared tokens, then each head's own share "
        "among the rest; --verbatim-source kvzip), none (virtual tokens alone); default: per-head where the recipe "
        "allows it (a per-head head budget ranked by reconstruction, no fit_bias), else none",
        VERBATIM_MODES,
    )
    shared: HybridConfig = nested(HybridConfig, prefix="verbatim_")  # the shared verbatim part's settings
    target_source: str = setting(
        "online",
        "in a loop (per turn, in chunks, auto-ratio): online: V on top of the compressed cache, as a live agent has it; "
        "oracle: V from the full uncompressed history",
        TARGET_MODES,
    )
    auto_ratio: bool = setting(
        False, "per turn, the highest ratio of --ladder whose V loss stays within --max-loss (instead of --ratio)"
    )
    tolerance: AutoRatioConfig = nested(AutoRatioConfig)

    def validate(self) -> VkvRecipe:
        """The recipe to run, every default that depends on the rest of it filled in (a copy): the verbatim mode, and
        the virtual tokens' recipe as that mode takes it (no per-head share beside shared tokens alone or with none)."""
        if self.tolerance.max_loss is not None and not self.auto_ratio:
            raise VkvError("field max_loss is the tolerance of auto_ratio (--auto-ratio); turn auto_ratio on")
        mode, compress = self.verbatim, self.compress
        if mode is not None and mode not in VERBATIM_MODES:
            raise VkvError(f"field verbatim: unknown value {mode!r}; choose one of {', '.join(VERBATIM_MODES)}")
        if mode == "shared":  # the shared part is every head's verbatim entries
            compress = HybridRecipe.of(compress).validate()
        elif mode == "none":
            if compress.verbatim_share:
                raise VkvError(
                    f"field verbatim_share: {compress.verbatim_share:g} keeps a per-head verbatim part, and field "
                    "verbatim is none; give verbatim per-head, or leave verbatim_share out"
                )
            compress = replace(compress, verbatim_share=0.0).validate()
        else:
            if mode == "shared+per-head":
                compress = _beside_shared_tokens(compress)
            compress = compress.validate()
            if mode is not None and not compress.verbatim_share:
                raise VkvError(
                    f"field verbatim: {mode} needs a per-head verbatim share, and this recipe keeps none (a shared "
                    "head budget, share_scores readout, fit_bias or verbatim_share 0); give verbatim "
                    + ("shared" if mode == "shared+per-head" else "none")
                )
            mode = mode or ("per-head" if compress.verbatim_share else "none")
        self.shared.validate()
        if self.auto_ratio:
            self.tolerance.validate()
        return replace(self, compress=compress, verbatim=mode)

    @property
    def shared_tokens(self) -> bool:
        """Whether every head keeps one set of the span's tokens verbatim (validated recipes only)."""
        return self.verbatim in ("shared", "shared+per-head")

    @property
    def per_head(self) -> bool:
        """Whether each KV head keeps its own verbatim entries (validated recipes only)."""
        return self.verbatim in ("per-head", "shared+per-head")

    def check_turn_by_turn(self) -> VkvRecipe:
        """Refuse a recipe that turn-by-turn compression cannot run (the single-span path takes it)."""
        if self.compress.pooling == "attention":
            raise VkvError("attention pooling needs a question, so per-turn compression cannot use it")
        if target_kind(self.compress.target).needs_queries:  # online targets would need the turn's queries
            raise VkvError(
                f"target {self.compress.target} is not implemented for per-turn compression; use v or kv-pre-rope"
            )
        return self

    @staticmethod
    def upgraded(d: dict[str, Any]) -> dict[str, Any]:
        return upgrade.vkv_recipe(d)


def _beside_shared_tokens(compress: CompressConfig) -> CompressConfig:
    """The virtual tokens' recipe beside shared tokens and a per-head share: each head's own entries are kvzip's
    choice among the tokens the shared part leaves (am's compaction is fitted on a whole span, with no shared entries
    beside it, so it is refused rather than approximated)."""
    if compress.verbatim_source == "am":
        raise VkvError(
            "field verbatim_source: am's compaction beside shared verbatim tokens is not implemented (it fits a whole "
            "span); give verbatim_source kvzip with verbatim shared+per-head"
        )
    return replace(compress, verbatim_source="kvzip")


def recipe_segment(
    work: SpanWork, recipe: VkvRecipe, budget: int, on_step: Callable[[int, float], None] | None = None
) -> Segment:
    """`budget` entries per KV head standing for the work's span (a whole span, or a turn on a running cache) as the
    validated `recipe` makes them: every vkv path runs this. The reconstruction pass ranks the heads' shares where
    the recipe asks for it; with shared tokens, they are chosen first and the virtual tokens (and each head's own
    entries) come from the rest; otherwise the per-head part (fitted by am, or the span's best entries) sits beside
    virtual tokens over the whole span."""
    compress = recipe.compress
    scores = reconstruction_scores(work) if compress.needs_reconstruction else None
    span_kv = work.kv.slice(work.start - work.kv_start, work.end - work.kv_start)
    prefix = work.prefix()
    if recipe.shared_tokens:
        return hybrid_segment(
            work.lm, work.ids, work.acts, span_kv, prefix, budget, compress, recipe.shared, work.message_starts,
            on_step, scores,
        )  # fmt: skip
    # the full-context K/V of ids[:end], the distillation's teacher (a turn's work holds only its own entries)
    teacher = work.kv if work.kv_start == 0 else None
    verbatim = fitted_verbatim(work, compress, budget)
    return virtual_segment(
        work.lm, work.ids, work.acts, prefix, compress, budget, work.message_starts, work.attention, on_step,
        teacher=teacher, token_scores=scores, span_kv=span_kv, verbatim=verbatim,
    )  # fmt: skip
