"""CompressConfig: every setting of the single-span recipe (what `vkv compress` and the `vkv` method run)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from vkv.compress.distill import DistillConfig
from vkv.compress.optimise import OptimConfig
from vkv.errors import VkvError
from vkv.settings import check_ranges, from_dict, nested, setting

BOUNDARIES = ("equal", "lines", "surprisal")
HEAD_SHARES = ("all", "uniform", "adaptive")  # which virtual tokens each KV head attends to (compress/head_budget.py)


def _pooling_rules():
    from vkv.compress.pooling import POOLING_RULES

    return sorted(POOLING_RULES)


def _position_schemes():
    from vkv.compress.positions import POSITION_SCHEMES

    return sorted(POSITION_SCHEMES)


def _target_kinds():
    from vkv.compress.targets import TARGET_KINDS

    return tuple(TARGET_KINDS)


@dataclass
class CompressConfig:
    ratio: float = setting(
        3.2, "span tokens per virtual token (≥ 1)", cli=False, minimum=1
    )  # each command takes its own
    pooling: str = setting("surprisal", "how tokens are weighted inside a block", _pooling_rules)
    positions: str = setting(
        "centres", "where virtual tokens sit: centres = the mean position of their block's tokens", _position_schemes
    )
    target: str = setting("v", "what the virtual tokens' K/V must match", _target_kinds)
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
    )
    # (evals/RESULTS.md stage 1: retention 0.372 → 0.477 at 3.2×, better on three of four transcripts)
    fit_bias: bool = setting(
        False,
        "after the embeddings, fit one bias per layer, KV head and virtual token so that the span's own queries give "
        "the virtual tokens the attention mass they gave the span (am's non-negative least squares, started from "
        "the proportional-attention bias)",
    )
    # Chosen on the dev split (evals/RESULTS.md, issue 19 lever 6): adaptive +0.327 [+0.214, +0.426] retention at 3.2×
    # over all, uniform +0.215; oversample 1.5 instead of 2 −0.166 [−0.233, −0.106], 3 instead of 2 +0.125
    # [+0.041, +0.215] (with 10 steps; its file stays ≥ 8× smaller than am's cache since format 4 stores the masked
    # biases as numbers per token and per head)
    head_share: str = setting(
        "adaptive",
        "all: every KV head attends to every virtual token; uniform / adaptive: optimise `oversample` times the "
        "budget's virtual tokens, then each KV head attends only to its share of the budget (the ones the span's own "
        "queries attend to most; uniform: the same count per head, adaptive: AdaKV's split), the rest masked",
        HEAD_SHARES,
    )
    oversample: float = setting(
        3.0,
        "with head_share uniform or adaptive (unused with all): virtual tokens optimised per entry of the budget",
        minimum=1,
        above=True,  # each head must have more virtual tokens to choose from than it keeps
    )
    optim: OptimConfig = nested(OptimConfig)
    distill: DistillConfig = nested(DistillConfig, prefix="distill_")  # a KL stage after the V match (off by default)

    def validate(self) -> CompressConfig:
        """One clear error naming the field for a setting no compression path accepts."""
        from vkv.compress.pooling import POOLING_RULES
        from vkv.compress.positions import POSITION_SCHEMES
        from vkv.compress.targets import TARGET_KINDS

        for what, value, allowed in (
            ("pooling", self.pooling, POOLING_RULES),
            ("positions", self.positions, POSITION_SCHEMES),
            ("target", self.target, TARGET_KINDS),
            ("boundaries", self.boundaries, BOUNDARIES),
            ("head_share", self.head_share, HEAD_SHARES),
        ):
            if value not in allowed:
                raise VkvError(f"field {what}: unknown value '{value}'; choose one of {', '.join(allowed)}")
        check_ranges(self)
        self.optim.validate()
        self.distill.validate()
        return self

    def virtual_tokens(self, budget: int, available: int) -> int:
        """Virtual tokens to optimise for a budget of `budget` entries per KV head over `available` tokens: the budget,
        or `oversample` times it when each head attends only to its share."""
        return budget if self.head_share == "all" else min(available, round(budget * self.oversample))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompressConfig:
        return from_dict(cls, d)
