"""Where the virtual embeddings start before optimisation: the pooled embeddings, those with layer 0's V (and
pre-RoPE K) matched exactly by least squares, the span's mean, or random at the embedding table's scale."""

from __future__ import annotations

import math

import torch

from vkv.compress.targets import Targets
from vkv.errors import VkvError
from vkv.lm.frozen import FrozenLM

INITS = ("pooled", "random", "mean", "lstsq")


def initial_embeddings(
    lm: FrozenLM, targets: Targets, init: str, generator: torch.Generator, positions: torch.Tensor | None = None
) -> torch.Tensor:
    if init == "pooled":
        return targets.pooled_embeddings.clone()
    if init == "lstsq":
        return least_squares_init(lm, targets, targets.pooled_embeddings, positions)
    table = lm.embedding_matrix.float()
    if init == "mean":
        span_mean = (targets.pooled_embeddings.mean(0, keepdim=True)).expand(targets.k, -1)
        return span_mean.clone().cpu()
    noise = torch.randn(targets.k, table.shape[1], generator=generator)
    return noise * table.std().item()  # Cramming's init: Gaussian at the embedding table's scale


def least_squares_init(
    lm: FrozenLM, targets: Targets, start: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Embeddings `[k, hidden]` nearest to `start` whose layer-0 V (and pre-RoPE K, without a key norm)
    equal the targets wherever the projection allows.

    Layer 0 has no attention before its projections: V0 = v_proj(g ⊙ y) with y = x / rms(x). With x = c·y,
    y lies on a sphere |y|² = d(1 - eps/c²), and V0 is affine in y. So y = the minimum-norm solution of the
    (variance-weighted) linear system + start's null-space component, scaled to reach that sphere; then
    x = c·y with c = start's rms, keeping the pooled embedding's scale for the residual stream.
    """
    layer = lm.first_layer()
    eps = layer.norm_eps
    hidden = start.shape[-1]
    gain = layer.norm_gain.double().cpu()

    def affine(proj) -> tuple[torch.Tensor, torch.Tensor]:
        """weight `[out, hidden]`, bias `[out]` of a frozen (possibly int8) linear map, read by probing."""
        with torch.no_grad():
            probe = torch.cat([torch.zeros(1, hidden), torch.eye(hidden)]).to(lm.device, lm.dtype)
            out = proj(probe).double().cpu()
        return (out[1:] - out[0]).T, out[0]

    systems, rhs = [], []
    weight, bias = affine(layer.v_proj)
    target = targets.values[0].double().permute(1, 0, 2).reshape(targets.k, -1)  # [k, kv_heads * D]
    systems.append(weight * gain / targets.value_scale[0].double().sqrt())
    rhs.append((target - bias) / targets.value_scale[0].double().sqrt())
    if targets.keys is not None and not layer.key_norm:
        key_target = targets.keys[0].double()
        if targets.spec.keys == "post-rope":
            if positions is None:
                raise VkvError("least-squares init with post-RoPE key targets needs the virtual positions")
            key_target = lm.rotate(key_target.float(), positions, inverse=True).double()
        weight, bias = affine(layer.k_proj)
        systems.append(weight * gain / targets.key_scale[0].double().sqrt())
        rhs.append((key_target.permute(1, 0, 2).reshape(targets.k, -1) - bias) / targets.key_scale[0].double().sqrt())
    system, rhs_all = torch.cat(systems), torch.cat(rhs, dim=1)  # [m, hidden], [k, m]
    pinv = torch.linalg.pinv(system)  # [hidden, m]
    start = start.double()
    scale = start.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(2 * math.sqrt(eps))  # c, per token
    radius2 = hidden * (1 - eps / scale.pow(2))
    y_start = start / scale
    y_min = rhs_all @ pinv.T  # the minimum-norm exact solution, in the row space of the system
    null = y_start - (y_start @ system.T) @ pinv.T  # start's component the layer-0 projection cannot see
    room = (radius2 - y_min.pow(2).sum(-1, keepdim=True)).clamp_min(0)
    y = y_min + null * (room / null.pow(2).sum(-1, keepdim=True).clamp_min(1e-30)).sqrt()
    y = y * (radius2 / y.pow(2).sum(-1, keepdim=True)).sqrt()  # exact when reachable; else the nearest scale
    return (y * scale).float()
