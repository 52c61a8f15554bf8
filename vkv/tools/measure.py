"""Measuring a block of work: when each optimiser step's loss was known, the peak memory a block adds, what
autograd keeps for backward, step times taken in alternation, and a profile of one step."""

from __future__ import annotations

import ctypes
import gc
import re
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from vkv.lm.frozen import FrozenLM


class StepClock:
    """on_step callback recording when each step's loss was known."""

    def __init__(self):
        self.start = time.perf_counter()
        self.times: list[float] = []
        self.losses: list[float] = []

    def __call__(self, step: int, loss: float) -> None:
        self.times.append(time.perf_counter() - self.start)
        self.losses.append(loss)

    @property
    def seconds_per_step(self) -> float:
        gaps = [b - a for a, b in zip(self.times, self.times[1:])]
        return statistics.median(gaps) if gaps else float("nan")

    def reached(self, target: float, rel_tol: float = 1e-4) -> tuple[int, float] | None:
        """(step, seconds since start) of the first loss ≤ target (within float rounding of it)."""
        for step, (t, loss) in enumerate(zip(self.times, self.losses)):
            if loss <= target * (1 + rel_tol):
                return step, t
        return None


def _rss_mb() -> tuple[float, float]:
    status = Path("/proc/self/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    peak = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    return rss, peak


@contextmanager
def peak_memory(device: torch.device) -> Iterator[dict]:
    """Peak memory the block adds on top of what was in use before it, in MiB: `host_mb`, the peak resident set size
    (Linux; reset before the block, freed heap returned to the OS first), and on CUDA `device_mb`, torch's allocator
    peak on `device` (None elsewhere). Either is None where it cannot be read."""
    found: dict = {"host_mb": None, "device_mb": None}
    gc.collect()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        device_base = torch.cuda.memory_allocated(device)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        host_base, _ = _rss_mb()
    except OSError:
        host_base = None
    yield found
    if cuda:
        torch.cuda.synchronize(device)
        found["device_mb"] = (torch.cuda.max_memory_allocated(device) - device_base) / 2**20
    if host_base is not None:
        found["host_mb"] = _rss_mb()[1] - host_base


@contextmanager
def working_memory(device: torch.device) -> Iterator[dict]:
    """Peak memory the block adds where `device` computes, in MiB (`mb`): `peak_memory`'s device peak on CUDA, its
    host peak on the CPU."""
    found: dict = {"mb": None}
    with peak_memory(device) as peaks:
        yield found
    found["mb"] = peaks["device_mb" if device.type == "cuda" else "host_mb"]


def saved_activation_mb(lm: FrozenLM, run: Callable[[], torch.Tensor], exclude: list[torch.Tensor]) -> float:
    """MiB of distinct tensors autograd keeps for backward while `run()` builds its graph (weights, buffers
    and `exclude`d tensors such as the stored prefix do not count: they exist anyway)."""
    skip = {t.untyped_storage().data_ptr() for t in [*lm.model.parameters(), *lm.model.buffers(), *exclude]}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    del out
    return sum(kept.values()) / 2**20


def interleaved_step_seconds(steps: dict[str, Callable[[], object]], rounds: int = 5) -> dict[str, float]:
    """Median seconds of each step function, timed in alternation (round robin, after one warm-up each) so
    that a machine whose load drifts slows every contender alike."""
    for fn in steps.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def profile_step(run: Callable[[], None], rows: int = 14) -> tuple[str, dict[str, float]]:
    """torch.profiler table of `run()` (self time per op) and the share of self time in matmul kernels."""
    run()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    matmul = sum(
        e.self_cpu_time_total
        for e in events
        if e.key in ("aten::mm", "aten::bmm", "aten::addmm", "aten::_int_mm", "aten::baddbmm")
    )
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    shares = {e.key: e.self_cpu_time_total / total for e in top}
    shares["matmul (mm, bmm, addmm)"] = matmul / total
    return events.table(sort_by="self_cpu_time_total", row_limit=rows), shares
