"""Seconds per named stage of a compression (prefill, read-out, on-policy advance, selection, β, values, steps, …),
recorded where a caller asks for them (`vkv bench compress`) and free where nobody does.

`with recording() as seconds:` collects every `with stage(name):` run inside it, in any module, into the dict
`seconds` (name → seconds, summed over repeats); stages nest, and an inner stage's time also counts in the outer one.
On CUDA a stage synchronises the device at its ends (only while recording), so the seconds are the GPU's work, not
the time to queue it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_active: ContextVar[dict[str, float] | None] = ContextVar("vkv_stage_seconds", default=None)


@contextmanager
def recording() -> Iterator[dict[str, float]]:
    """Collect the stages run inside the block: name → seconds, in the order each first ran."""
    seconds: dict[str, float] = {}
    token = _active.set(seconds)
    try:
        yield seconds
    finally:
        _active.reset(token)


@contextmanager
def stage(name: str, device: torch.device | None = None) -> Iterator[None]:
    """Time the block as stage `name` when a `recording` is active (else nothing is measured); `device`: the CUDA
    device whose queued work belongs to the stage."""
    seconds = _active.get()
    if seconds is None:
        yield
        return
    sync = device is not None and device.type == "cuda"
    if sync:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    try:
        yield
    finally:
        if sync:
            torch.cuda.synchronize(device)
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
