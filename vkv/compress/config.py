"""CompressConfig: every setting of the single-span recipe (what `vkv compress` and the `vkv` method run)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from vkv.compress.distill import DistillConfig
from vkv.compress.optimise import OptimConfig
from vkv.errors import VkvError

BOUNDARIES = ("equal", "lines", "surprisal")


@dataclass
class CompressConfig:
    ratio: float = 3.2
    pooling: str = "surprisal"
    positions: str = "centres"  # each virtual token at the mean position of the tokens it stands for
    target: str = "v"
    attention_weight: float = 1.0  # target v+attention: weight of the read-out error next to the V loss
    boundaries: str = "surprisal"  # blocks of equal surprisal mass; or "equal" token counts, or snapped to "lines"
    mass_floor: float = 0.0  # boundaries "surprisal": each token's mass is its surprisal + this × the span's mean
    proportional_attention: bool = True  # later queries weigh each virtual token by its block's token count
    # (evals/RESULTS.md stage 1: retention 0.372 → 0.477 at 3.2×, better on three of four transcripts)
    optim: OptimConfig = field(default_factory=OptimConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)  # a KL stage after the V match (off by default)

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
        ):
            if value not in allowed:
                raise VkvError(f"field {what}: unknown value '{value}'; choose one of {', '.join(allowed)}")
        if not self.mass_floor >= 0:
            raise VkvError(f"field mass_floor: must be ≥ 0, got {self.mass_floor}")
        if not self.attention_weight >= 0:
            raise VkvError(f"field attention_weight: must be ≥ 0, got {self.attention_weight}")
        self.optim.validate()
        self.distill.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompressConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise VkvError(f"unknown compression setting(s): {', '.join(sorted(unknown))}")
        nested = {}
        for name, kind in (("optim", OptimConfig), ("distill", DistillConfig)):
            given = d.get(name, {})
            unknown_nested = set(given) - {f.name for f in fields(kind)}
            if unknown_nested:
                raise VkvError(f"unknown {name} setting(s): {', '.join(sorted(unknown_nested))}")
            nested[name] = kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})
        return cls(**{**d, **nested})
