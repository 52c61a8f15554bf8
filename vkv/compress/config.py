"""CompressConfig: every setting of the single-span recipe (what `vkv compress` and the `vkv` method run)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vkv.compress.distill import DistillConfig
from vkv.compress.head_budget import HEAD_BUDGETS, head_budget_setting
from vkv.compress.optimise import OptimConfig
from vkv.compress.pooling import POOLING_RULES
from vkv.compress.positions import POSITION_SCHEMES
from vkv.compress.targets import TARGET_KINDS
from vkv.errors import VkvError
from vkv.settings import Config, check_ranges, nested, setting

BOUNDARIES = ("equal", "lines", "surprisal")
SHARE_SCORES = ("readout", "reconstruction")


@dataclass
class CompressConfig(Config):
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
    proportional_attention: bool = setting(
        True, "later queries add log(tokens per virtual token) to their attention logits"
    )  # evidence: evals/RESULTS.md, stage 1
    fit_bias: bool = setting(
        False,
        "after the embeddings, fit one bias per layer, KV head and virtual token so that the span's own queries give "
        "the virtual tokens the attention mass they gave the span (am's non-negative least squares, started from "
        "the proportional-attention bias)",
    )
    head_budget: str = head_budget_setting()  # with uniform or adaptive, `oversample` × the budget's virtual tokens
    oversample: float = setting(
        3.0,
        "with head_budget uniform or adaptive (unused with shared): virtual tokens optimised per entry of the budget, "
        "of which each KV head attends to its share of the budget, those the span's own queries attend to most",
        minimum=1,
        above=True,  # each head must have more virtual tokens to choose from than it keeps
    )
    share_scores: str = setting(
        "readout",
        "with head_budget uniform or adaptive: how each KV head ranks the virtual tokens for its share. readout: the "
        "mean attention the span's own queries give them; reconstruction: the most KVzip importance (the "
        "reconstruction pass's attention, kvzip's scores) any token of their block receives in that head",
        SHARE_SCORES,
    )
    verbatim_share: float = setting(
        0.0,
        "with share_scores reconstruction: share of each KV head's budget kept as the span's own entries, those "
        "KVzip's reconstruction importance ranks best for the head; the rest go to virtual tokens ranked by the "
        "best token of their block the head did not keep (0: all virtual)",
        minimum=0,
    )
    optim: OptimConfig = nested(OptimConfig)
    distill: DistillConfig = nested(DistillConfig, prefix="distill_")  # a KL stage after the V match (off by default)

    def validate(self) -> CompressConfig:
        """One clear error naming the field for a setting no compression path accepts."""
        for what, value, allowed in (
            ("pooling", self.pooling, POOLING_RULES),
            ("positions", self.positions, POSITION_SCHEMES),
            ("target", self.target, TARGET_KINDS),
            ("boundaries", self.boundaries, BOUNDARIES),
            ("head_budget", self.head_budget, HEAD_BUDGETS),
            ("share_scores", self.share_scores, SHARE_SCORES),
        ):
            if value not in allowed:
                raise VkvError(f"field {what}: unknown value '{value}'; choose one of {', '.join(allowed)}")
        check_ranges(self)
        if self.verbatim_share:
            if not self.verbatim_share < 1:
                raise VkvError(f"field verbatim_share: must be a fraction in [0, 1), got {self.verbatim_share}")
            if not self.needs_reconstruction:
                raise VkvError(
                    "field verbatim_share: each head's verbatim entries are chosen by the reconstruction pass; it needs "
                    "head_budget uniform or adaptive and share_scores reconstruction"
                )
            if self.fit_bias or self.distill.steps:
                raise VkvError(
                    "field verbatim_share: fit_bias and the distillation stage are not implemented beside verbatim "
                    "entries (they fit the virtual tokens alone); set them off or verbatim_share to 0"
                )
        self.optim.validate()
        self.distill.validate()
        return self

    def virtual_tokens(self, budget: int, available: int) -> int:
        """Virtual tokens to optimise for a budget of `budget` entries per KV head over `available` tokens: the budget,
        or `oversample` times it when each head attends only to its share."""
        return budget if self.head_budget == "shared" else min(available, round(budget * self.oversample))

    @property
    def needs_reconstruction(self) -> bool:
        """Whether the heads' shares are ranked by the reconstruction pass's importance of the span's tokens."""
        return self.head_budget != "shared" and self.share_scores == "reconstruction"

    @staticmethod
    def upgraded(d: dict[str, Any]) -> dict[str, Any]:
        return upgraded(d)


def upgraded(d: dict[str, Any]) -> dict[str, Any]:
    """A recipe as sessions saved by earlier versions record it, in today's spelling, so that they still load: the ratio lived in the recipe before each command took its own, and `head_share` (all, uniform,
    adaptive) became the `head_budget` every method shares (shared, uniform, adaptive)."""
    d = {k: v for k, v in (d or {}).items() if k != "ratio"}
    if "head_share" in d:
        share = d.pop("head_share")
        d.setdefault("head_budget", "shared" if share == "all" else share)
    return d
