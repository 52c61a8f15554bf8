"""Where virtual tokens sit on the RoPE axis: a registry of position schemes.

A span [a, b) of original tokens is replaced by k virtual tokens; tokens after the span always continue at
the original logical position b, whatever the scheme.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vkv.errors import VkvError
from vkv.registry import registrar

PositionScheme = Callable[..., torch.Tensor]  # (start, end, k, centres=None) -> [k]
POSITION_SCHEMES: dict[str, PositionScheme] = {}
scheme = registrar(POSITION_SCHEMES)


@scheme("interpolate")
def interpolate(start: int, end: int, k: int, **_) -> torch.Tensor:
    """Spread k positions evenly over [start, end-1], fractional: relative distances match the original."""
    if k == 1:
        return torch.tensor([(start + end - 1) / 2.0])
    return torch.linspace(float(start), float(end - 1), k)


@scheme("rounded")
def rounded(start: int, end: int, k: int, **_) -> torch.Tensor:
    """The interpolated positions rounded to integers (as in EPL)."""
    return torch.round(interpolate(start, end, k))


@scheme("consecutive")
def consecutive(start: int, end: int, k: int, **_) -> torch.Tensor:
    """start, start+1, …: packs virtual tokens at the front, distorting distances to later tokens."""
    return torch.arange(start, start + k, dtype=torch.float32)


@scheme("centres")
def block_centres(start: int, end: int, k: int, centres: torch.Tensor | None = None) -> torch.Tensor:
    """Each virtual token at the mean original position of the tokens it stands for: the same as
    interpolate up to half a block for equal blocks, and faithful when blocks differ in length."""
    if centres is None:
        raise VkvError("the 'centres' position scheme needs the blocks the virtual tokens stand for")
    return centres


def virtual_positions(name: str, start: int, end: int, k: int, centres: torch.Tensor | None = None) -> torch.Tensor:
    """Positions `[k]` (float32) for k virtual tokens replacing [start, end); `centres` `[k]` holds the mean
    original position of each block's tokens (needed by the 'centres' scheme only)."""
    if name not in POSITION_SCHEMES:
        raise VkvError(f"unknown position scheme '{name}'; choose one of {', '.join(POSITION_SCHEMES)}")
    if not 0 < k <= end - start:
        raise VkvError(f"cannot place {k} virtual tokens in the span [{start}, {end})")
    if centres is not None and centres.shape != (k,):
        raise VkvError(f"block centres have shape {tuple(centres.shape)}, expected ({k},)")
    return POSITION_SCHEMES[name](start, end, k, centres=centres).float()
