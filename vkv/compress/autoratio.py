"""Loss-aware ratios: per turn, the highest ratio of a ladder whose question-free loss stays within tolerance.

The signal is the normalised V loss of the compressed turn: the MSE between the V the segment stores and the
pooled targets, divided by the variance of the original tokens' V, averaged over all layers, measured in
fp32 on the stored entries (not the optimiser's own, possibly bf16, figure). It needs no question, so easy
turns compress more and dense turns less. The ladder is searched by bisection (assuming the loss grows with the ratio), and
only a segment whose loss was measured within tolerance is ever returned; when no ratio qualifies the turn
is kept verbatim (loss 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vkv.compress.budget import entries_at
from vkv.compress.targets import Targets
from vkv.errors import VkvError
from vkv.kv.segment import Segment
from vkv.settings import Config, setting

DEFAULT_LADDER = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0)


@dataclass
class AutoRatioConfig(Config):
    """The tolerance and the ratios tried per turn."""

    max_loss: float | None = setting(
        None, "the tolerance: normalised V loss (layer mean) a turn may reach, e.g. 0.3", minimum=0, above=True
    )
    ladder: tuple[float, ...] = setting(DEFAULT_LADDER, "the ratios tried, each ≥ 1", minimum=1)

    def validate(self) -> AutoRatioConfig:
        if self.max_loss is None:
            raise VkvError("field max_loss: auto-ratio needs a tolerance (normalised V loss, e.g. 0.3)")
        if isinstance(self.max_loss, bool) or not (
            isinstance(self.max_loss, (int, float)) and math.isfinite(self.max_loss) and self.max_loss > 0
        ):
            raise VkvError(f"field max_loss: must be a positive number, got {self.max_loss!r}")
        if not self.ladder or any(not r >= 1.0 for r in self.ladder):
            raise VkvError(f"the ratio ladder must be a non-empty list of ratios ≥ 1, got {list(self.ladder)}")
        self.ladder = tuple(sorted(set(float(r) for r in self.ladder)))
        return self


def v_loss(values: torch.Tensor, targets: Targets) -> list[float]:
    """Per-layer normalised V loss of stored values `[layers, kv_heads, k, head_dim]` against the targets."""
    error = (values.float() - targets.values.float().to(values.device)).pow(2).mean(dim=(1, 2, 3))
    return (error / targets.value_scale.float().to(values.device)).tolist()


def record_loss(segment: Segment, values: torch.Tensor, targets: Targets) -> Segment:
    """Measure `values` (the segment's virtual entries) against their targets into the segment's stats."""
    per_layer = v_loss(values, targets)
    segment.stats["per_layer_v_loss"] = per_layer
    segment.stats["loss"] = sum(per_layer) / len(per_layer)
    return segment


def segment_loss(segment: Segment) -> float | None:
    """The measured normalised V loss (layer mean); 0 for verbatim entries; None for a segment that records its loss
    as None (it holds no virtual token to measure); else the optimiser's figure."""
    if segment.kind == "verbatim":
        return 0.0
    if "loss" in segment.stats:
        return None if segment.stats["loss"] is None else float(segment.stats["loss"])
    per_layer = segment.stats.get("per_layer_loss") or [0.0]
    return float(sum(per_layer) / len(per_layer))


def choose_ratio(
    span_tokens: int,
    build: Callable[[int], Segment],
    keep_verbatim: Callable[[], Segment],
    config: AutoRatioConfig,
) -> Segment:
    """The segment of the highest ladder ratio with loss ≤ max_loss; `build(entries)` compresses the turn into
    that many entries, `keep_verbatim()` is the fallback. Stats record every ratio tried and its loss."""
    config.validate()
    ladder = list(config.ladder)
    built: dict[int, Segment] = {}  # short turns map several ratios to one entry count
    tried: dict[str, float] = {}
    best: tuple[float, Segment] | None = None
    low, high = 0, len(ladder) - 1
    while low <= high:
        middle = (low + high) // 2
        ratio = ladder[middle]
        entries = entries_at(span_tokens, ratio)
        if entries not in built:
            built[entries] = build(entries)
        loss = segment_loss(built[entries])
        tried[str(ratio)] = None if loss is None else round(loss, 6)
        if loss is not None and loss <= config.max_loss:  # a loss that cannot be measured is not within tolerance
            best, low = (ratio, built[entries]), middle + 1
        else:
            high = middle - 1
    chosen_ratio, segment = best if best is not None else (1.0, keep_verbatim())
    segment.stats["auto_ratio"] = {"max_loss": config.max_loss, "chosen": chosen_ratio, "tried": tried}
    return segment
