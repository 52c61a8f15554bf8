"""What the virtual tokens are optimised towards: pooled per-layer V (and optionally K) of a span."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .capture import Activations
from .errors import VkvError
from .model import FrozenLM
from .pooling import Blocks, pool

TARGET_KINDS = ("v", "kv-pre-rope", "kv-post-rope")


@dataclass
class Targets:
    """Pooled targets for k virtual tokens standing for original tokens [start, end)."""

    kind: str
    start: int
    end: int
    blocks: Blocks
    weights: torch.Tensor  # [span] pooling weights, summing to 1 within each block
    values: torch.Tensor  # [layers, kv_heads, k, head_dim]
    value_scale: torch.Tensor  # [layers] variance of the original span's V: makes every layer count equally
    keys: torch.Tensor | None  # [layers, kv_heads, k, head_dim], pre- or post-RoPE by kind; None for "v"
    key_scale: torch.Tensor | None  # [layers]
    pooled_embeddings: torch.Tensor  # [k, hidden] the same weights applied to the token embeddings

    @property
    def k(self) -> int:
        return self.blocks.count


def build_targets(
    lm: FrozenLM, ids: torch.Tensor, acts: Activations, blocks: Blocks, weights: torch.Tensor, kind: str = "v"
) -> Targets:
    if kind not in TARGET_KINDS:
        raise VkvError(f"unknown target '{kind}'; choose one of {', '.join(TARGET_KINDS)}")
    values = pool(acts.values, blocks, weights, dim=2)
    keys = key_scale = None
    if kind != "v":
        original_keys = acts.keys_pre_rope
        if kind == "kv-post-rope":  # the recipe's Failure 2: averages keys rotated to different positions
            original_keys = lm.rotate(original_keys, torch.arange(acts.start, acts.end))
        keys = pool(original_keys, blocks, weights, dim=2)
        key_scale = _per_layer_variance(original_keys)
    with torch.no_grad():
        span_embeddings = lm.embed(ids[acts.start : acts.end]).float().cpu()
    return Targets(
        kind=kind,
        start=acts.start,
        end=acts.end,
        blocks=blocks,
        weights=weights,
        values=values,
        value_scale=_per_layer_variance(acts.values),
        keys=keys,
        key_scale=key_scale,
        pooled_embeddings=pool(span_embeddings, blocks, weights, dim=0),
    )


def _per_layer_variance(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1).var(dim=1).clamp_min(1e-8)
