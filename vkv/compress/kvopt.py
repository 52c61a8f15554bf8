"""Free keys, values and biases per (layer, KV head), optimised directly on the read-out (KVSculpt-style).

Attention matching (compaction.py) keeps t of the span's own keys and fits biases and values in closed form; here
the keys move too. Starting from a selection of t entries per row, Adam minimises, over the reference queries, what
vkv's attention target measures (kv_loss.py's `_attention_distance`): the error of what each query reads, relative
to the span's value variance, plus the squared error of its log-normaliser, so that mixing with the prefix and with
later tokens is kept as well as the read-out. No embedding is involved: it is an upper bound in KV space for any
method that stores t entries per head, not a cache a model could have produced.

Rows are prepared a layer at a time, as `compact` fits them (a row's attention over the whole span is held a chunk of
queries at a time); the descent then needs only the span's read-outs and log-normalisers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vkv.compress.compaction import RowStats, SpanReadout, fit_rows, row_stats
from vkv.kv.segment import MASKED

INITS = ("keep", "fit")


@dataclass
class FreeEntries:
    """t optimised entries per row; padding slots (head-wise budgets) keep their start and a bias of −inf."""

    keys: torch.Tensor  # [R, t, D] post-RoPE
    values: torch.Tensor  # [R, t, D]
    bias: torch.Tensor  # [R, t]
    start_loss: torch.Tensor  # [R] the read-out loss of the start
    loss: torch.Tensor  # [R] the read-out loss of the entries returned (the best iterate: never above start_loss)


@dataclass
class _LayerTarget:
    """What one layer's rows must read: the reference queries and the whole span's answers to them."""

    queries: torch.Tensor  # [r, m, D] scaled, post-RoPE
    outputs: torch.Tensor  # [r, m, D] the span's read-outs
    log_mass: torch.Tensor  # [r, m] the span's log-normalisers
    value_scale: torch.Tensor  # [] the layer's value variance: every layer counts equally, as in vkv's V loss

    def loss(self, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """Per-row read-out loss `[r]` of entries `keys`, `values` `[r, t, D]`, `bias` `[r, t]`, mean over queries."""
        scores = self.queries @ keys.transpose(1, 2) + bias[:, None, :]  # [r, m, t]
        output_error = (scores.softmax(-1) @ values - self.outputs).pow(2).mean(-1) / self.value_scale
        mass_error = (scores.logsumexp(-1) - self.log_mass).pow(2)
        return (output_error + mass_error).mean(-1)


def optimise_entries(
    readout: SpanReadout,
    index: torch.Tensor,
    real: torch.Tensor,
    kv_heads: int,
    init: str = "fit",
    steps: int = 100,
    lr: float = 1e-2,
    ridge: float = 0.0,
    device: torch.device | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> FreeEntries:
    """Free entries for every row of `readout` (rows layer-major, `kv_heads` per layer), starting from the entries
    at span-relative `index` `[R, t]` (`real` `[R, t]` bool: False marks a padding slot).

    `init="keep"` starts from the entries' own keys and values with bias 0; `"fit"` from attention matching's fit on
    the same entries (the reference's bounded NNLS biases, least-squares values, `ridge` pulling them toward the
    entries' own). Then `steps` Adam steps on keys, values and biases
    jointly, on `device` (default CPU); each row keeps its best iterate, since a step may raise its loss.
    `on_step(step, loss)` sees the mean loss over rows before each step (and after the last). Float32 and
    deterministic: nothing is drawn at random. Returned tensors are on the CPU."""
    if init not in INITS:
        raise ValueError(f"unknown init '{init}'; choose one of {', '.join(INITS)}")
    rows, n, _ = readout.keys.shape
    if index.shape != real.shape or index.shape[0] != rows:
        raise ValueError(f"index {tuple(index.shape)} and real {tuple(real.shape)} must be [{rows}, t]")
    device = torch.device("cpu") if device is None else device
    layers = [slice(r, min(r + kv_heads, rows)) for r in range(0, rows, kv_heads)]
    targets, starts = _targets_and_starts(readout, layers, index, real, init, ridge, device)
    start_keys, start_values, start_bias = (torch.stack(s).cpu() for s in zip(*starts))
    mask = real.to(device)
    # A padding slot's bias is a finite 0 under a mask applied in every forward, not a −inf parameter: its gradient
    # is then exactly 0 and Adam never moves it (nor its key and value, which no query attends to).
    params = [
        start_keys.to(device).clone().requires_grad_(True),
        start_values.to(device).clone().requires_grad_(True),
        start_bias.to(device).masked_fill(~mask, 0.0).requires_grad_(True),
    ]
    best, best_loss, start_loss = _descend(params, layers, targets, mask, steps, lr, on_step)
    keys, values, bias = (b.cpu() for b in best)
    padding = ~real
    return FreeEntries(
        torch.where(padding[..., None], start_keys, keys),
        torch.where(padding[..., None], start_values, values),
        bias.masked_fill(padding, MASKED),
        start_loss.cpu(),
        best_loss.cpu(),
    )


def _targets_and_starts(
    readout: SpanReadout,
    layers: list[slice],
    index: torch.Tensor,
    real: torch.Tensor,
    init: str,
    ridge: float,
    device: torch.device,
) -> tuple[list[_LayerTarget], list]:
    """What each layer's rows must read and each row's start (`_start`), a layer at a time on `device`."""
    targets, starts = [], []
    for layer in layers:
        part = readout.rows(layer)
        part = SpanReadout(*(t.to(device, torch.float32) for t in (part.queries, part.keys, part.values)))
        stats = row_stats(part)
        starts.extend(_start(part, stats, index[layer].to(device), real[layer].to(device), init, ridge))
        targets.append(
            _LayerTarget(
                part.queries, stats.outputs, stats.log_max + stats.mass.log(), part.values.var().clamp_min(1e-8)
            )
        )
    return targets, starts


def _descend(
    params: list[torch.Tensor],
    layers: list[slice],
    targets: list[_LayerTarget],
    mask: torch.Tensor,
    steps: int,
    lr: float,
    on_step: Callable[[int, float], None] | None,
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """`steps` Adam steps on `params` (keys, values and biases, rows first; `mask` `[R, t]` False at padding), each
    row keeping its best iterate → (the best keys, values and biases, their loss `[R]`, the start's loss `[R]`)."""
    optimiser = torch.optim.Adam(params, lr=lr)
    best = [p.detach().clone() for p in params]
    best_loss = torch.full((params[0].shape[0],), math.inf, device=params[0].device)
    start_loss = None
    for step in range(steps + 1):
        learning = step < steps
        losses = []
        for layer, target in zip(layers, targets):
            with torch.set_grad_enabled(learning):
                keys, values, bias = (p[layer] for p in params)
                loss = target.loss(keys, values, bias.masked_fill(~mask[layer], MASKED))
            if learning:  # each row's gradient is its own loss's: rows are independent problems
                loss.sum().backward()
            losses.append(loss.detach())
        loss = torch.cat(losses)
        start_loss = loss if start_loss is None else start_loss
        better = loss < best_loss  # strict, and False for NaN: ties and failures keep the earlier iterate
        for kept, current in zip(best, params):
            kept.copy_(torch.where(better.view(-1, *[1] * (current.dim() - 1)), current.detach(), kept))
        best_loss = torch.where(better, loss, best_loss)
        if on_step is not None:
            on_step(step, float(loss.mean()))
        if learning:
            optimiser.step()
            optimiser.zero_grad(set_to_none=True)
    return best, best_loss, start_loss


def _start(
    part: SpanReadout, stats: RowStats, index: torch.Tensor, real: torch.Tensor, init: str, ridge: float
) -> list:
    """Each row's start (keys `[t, D]`, values `[t, D]`, bias `[t]`) from its entries `index` `[r, t]` (`real` its
    slots that hold entries): their own keys and values with bias 0, or with `fit` attention matching's fit on them
    (the bounded NNLS biases and least-squares values of highest-attention keys); padding keeps its own, at −inf."""
    gather = index[..., None].expand(-1, -1, part.keys.shape[-1])
    keys, values = part.keys.gather(1, gather), part.values.gather(1, gather)
    bias = torch.zeros(index.shape, device=index.device).masked_fill(~real, MASKED)
    if init == "fit":
        fitted_bias, fitted = fit_rows(part, stats, index, real, "rms", "nnls", "refit", ridge)
        bias = torch.where(real, fitted_bias, bias)
        values = torch.where(real[..., None], fitted, values)
    return list(zip(keys, values, bias))
