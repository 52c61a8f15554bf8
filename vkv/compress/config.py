"""CompressConfig: every setting of the single-span recipe (what `vkv compress` and the `vkv` method run)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from vkv import upgrade
from vkv.compress.distill import DistillConfig
from vkv.compress.head_budget import HeadBudget, head_budget_setting
from vkv.compress.optimise import OptimConfig
from vkv.compress.pooling import POOLING_RULES
from vkv.compress.positions import POSITION_SCHEMES
from vkv.compress.targets import TARGET_KINDS
from vkv.errors import VkvError
from vkv.settings import Config, check_ranges, nested, setting

BOUNDARIES = ("equal", "lines", "surprisal")
SHARE_SCORES = ("readout", "reconstruction")
VERBATIM_SOURCES = ("kvzip", "am")
DEFAULT_VERBATIM_SOURCE = "am"  # chosen on the long dev split's 2,048-token windows at 8x and 16x (evals/RESULTS.md)
DEFAULT_VERBATIM_SHARE = 0.9  # chosen on the long dev split at 8x and 16x (evals/RESULTS.md, issue 33)
DEFAULT_VIRTUAL_OFFSET = -4.0  # chosen on the long dev split's whole sessions at 3.2x (evals/RESULTS.md, issue 33)


@dataclass
class CompressConfig(Config):
    head_verbatim: ClassVar[bool] = True  # whether the default recipe keeps a per-head verbatim share (where it can)
    pooling: str = setting("surprisal", "how tokens are weighted inside a block", lambda: sorted(POOLING_RULES))
    positions: str = setting(
        "centres",
        "where virtual tokens sit: centres = the mean position of their block's tokens",
        lambda: sorted(POSITION_SCHEMES),
    )
    target: str = setting("v", "what the virtual tokens' K/V must match", lambda: tuple(TARGET_KINDS))
    attention_weight: float = setting(
        1.0, "with --target v+attention: weight of the read-out error next to the V loss", minimum=0
    )
    boundaries: str = setting(
        "surprisal",
        "blocks of equal token counts, snapped to line/message starts, or of equal surprisal mass",
        BOUNDARIES,
    )
    mass_floor: float = setting(
        0.0, "with --boundaries surprisal: each token's block mass is its surprisal + this × the span's mean", minimum=0
    )
    proportional_attention: bool | None = setting(
        None,
        "later queries add log(tokens per virtual token) to their attention logits (default: on for virtual tokens "
        "alone, off beside a per-head verbatim share, where it weighs them against verbatim entries)",
    )  # evidence: evals/RESULTS.md, stage 1 and issue 33
    fit_bias: bool = setting(
        False,
        "after the embeddings, fit one bias per layer, KV head and virtual token so that the span's own queries give "
        "the virtual tokens the attention mass they gave the span (am's non-negative least squares, started from "
        "the proportional-attention bias)",
    )
    # KVzip's one threshold over every layer and head, as the faithful anchors spend a budget: the per-head verbatim
    # part chosen so beats AdaKV's per-layer split on the dev screens (evals/RESULTS.md, "Virtual tokens against the
    # faithful anchors"); per head (not shared), `oversample` × the budget's virtual tokens
    head_budget: HeadBudget = head_budget_setting(HeadBudget.GLOBAL)
    oversample: float = setting(
        3.0,
        "with a per-head head_budget (unused with shared): virtual tokens optimised per entry of the budget, "
        "of which each KV head attends to its share of the budget, those the span's own queries attend to most",
        minimum=1,
        above=True,  # each head must have more virtual tokens to choose from than it keeps
    )
    share_scores: str = setting(
        "reconstruction",
        "with a per-head head_budget: how each KV head ranks the virtual tokens for its share. readout: the "
        "mean attention the span's own queries give them; reconstruction: the most KVzip importance (the "
        "reconstruction pass's attention, kvzip's scores) any token of their block receives in that head",
        SHARE_SCORES,
    )
    verbatim_share: float | None = setting(
        None,
        "--verbatim per-head (or shared+per-head), with share_scores reconstruction: share of each KV head's budget "
        "kept verbatim, as --verbatim-source chooses it (am's compaction by default); the rest go to virtual "
        "tokens ranked by the best token of their block the head did not keep (0: all virtual; default: "
        f"{DEFAULT_VERBATIM_SHARE} where the recipe allows verbatim entries, else 0; the shared part's own share is "
        "--verbatim-fraction)",
        minimum=0,
        below=1,
    )
    verbatim_source: str | None = setting(
        None,
        "with a verbatim share: what each KV head keeps verbatim. kvzip: the span's own entries its reconstruction "
        "importance ranks best; am: attention matching's compaction at the verbatim share of the budget (its kept "
        f"keys, fitted biases and refitted values) (default: {DEFAULT_VERBATIM_SOURCE} beside a verbatim share, else "
        "kvzip: no head keeps a verbatim part)",
        VERBATIM_SOURCES,
    )
    virtual_offset: float | None = setting(
        None,
        "with a verbatim share: added to every virtual token's attention logit, so that a negative offset makes the "
        "virtual tokens yield attention to the exact entries beside them (0: weighed by their keys alone; default: "
        f"{DEFAULT_VIRTUAL_OFFSET} beside a verbatim share, else 0)",
        minimum=-30,  # e^-30 of a key's weight: the virtual tokens are gone; lower would only underflow
    )
    optim: OptimConfig = nested(OptimConfig)
    distill: DistillConfig = nested(DistillConfig, prefix="distill_")  # a KL stage after the V match (off by default)

    def validate(self) -> CompressConfig:
        """One clear error naming the field for a combination of settings no compression path accepts (each field's
        type, range and choices are checked as the config is built); returns the recipe to run, with
        the settings whose default depends on the rest of the recipe filled in (a copy: this one is not changed, so
        it can serve several methods)."""
        check_ranges(self)
        self = self._resolved()
        if self.verbatim_share:
            if not self.needs_reconstruction:
                raise VkvError(
                    "field verbatim_share: each head's verbatim entries are chosen by the reconstruction pass; it needs "
                    "a per-head head_budget (uniform, adaptive or global) and share_scores reconstruction"
                )
            if self.fit_bias:
                raise VkvError(
                    "field verbatim_share: fit_bias is not implemented beside verbatim entries (it fits the virtual "
                    "tokens alone); set it off or verbatim_share to 0"
                )
        if self.verbatim_source != "kvzip" and not self.verbatim_share:
            raise VkvError(
                f"field verbatim_source: {self.verbatim_source} fills a verbatim share, and this recipe keeps none "
                "(verbatim_share 0); give verbatim_share or leave verbatim_source at kvzip"
            )
        if self.virtual_offset and not self.verbatim_share:
            raise VkvError(
                "field virtual_offset: it weighs virtual tokens against the verbatim entries beside them, and this "
                "recipe keeps none (verbatim_share 0); set it to 0"
            )
        self.optim.validate()
        self.distill.validate()
        return self

    def _resolved(self) -> CompressConfig:
        """This recipe with the settings whose default depends on the rest of it filled in (None: not given), so that
        what runs and what is recorded are the same numbers: a per-head verbatim share where the recipe allows verbatim
        entries, am's compaction as that share, proportional attention only for virtual tokens alone, and a logit
        offset only beside verbatim entries."""
        share, proportional, source = self.verbatim_share, self.proportional_attention, self.verbatim_source
        if share is None:
            allowed = self.head_verbatim and self.needs_reconstruction and not self.fit_bias
            share = DEFAULT_VERBATIM_SHARE if allowed else 0.0
        if source is None:
            source = DEFAULT_VERBATIM_SOURCE if share else "kvzip"
        elif source not in VERBATIM_SOURCES:  # a None default leaves the choice to this check
            raise VkvError(
                f"field verbatim_source: unknown value {source!r}; choose one of {', '.join(VERBATIM_SOURCES)}"
            )
        if proportional is None:
            proportional = not share
        offset = self.virtual_offset
        if offset is None:
            offset = DEFAULT_VIRTUAL_OFFSET if share else 0.0
        resolved = (share, proportional, offset, source)
        if resolved == (self.verbatim_share, self.proportional_attention, self.virtual_offset, self.verbatim_source):
            return self
        return replace(
            self,
            verbatim_share=share,
            proportional_attention=proportional,
            virtual_offset=offset,
            verbatim_source=source,
        )

    @classmethod
    def of(cls, recipe: CompressConfig | None) -> CompressConfig:
        """`recipe` (None: the defaults) as this class, whose defaults may be resolved otherwise (`head_verbatim`)."""
        if recipe is None:
            return cls()
        return recipe if type(recipe) is cls else cls(**{f.name: getattr(recipe, f.name) for f in fields(recipe)})

    def virtual_tokens(self, budget: int, available: int) -> int:
        """Virtual tokens to optimise for a budget of `budget` entries per KV head over `available` tokens: the budget,
        or `oversample` times it when each head attends only to its share."""
        return min(available, round(budget * self.oversample)) if self.head_budget.per_head else budget

    @property
    def needs_reconstruction(self) -> bool:
        """Whether the heads' shares are ranked by the reconstruction pass's importance of the span's tokens."""
        return self.head_budget.per_head and self.share_scores == "reconstruction"

    @staticmethod
    def upgraded(d: dict[str, Any]) -> dict[str, Any]:
        return upgrade.recipe(d)
