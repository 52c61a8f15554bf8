"""Tune k virtual input embeddings on a frozen model until their per-layer K/V match the targets."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from .errors import VkvError
from .model import FrozenLM, KVPrefix
from .targets import Targets

INITS = ("pooled", "random", "mean")
LOSSES = ("mse", "cosine")
SCHEDULES = ("constant", "cosine")


@dataclass
class OptimConfig:
    steps: int = 500
    lr: float = 1e-2
    init: str = "pooled"
    loss: str = "mse"  # variance-normalised MSE per layer, or 1 - cosine similarity per head vector
    schedule: str = "constant"
    patience: int = 50  # stop when the best loss has not improved by min_rel_improvement for this many steps
    min_rel_improvement: float = 1e-3
    clip: float = 1.0
    max_lr_halvings: int = 4
    seed: int = 0

    def validate(self) -> "OptimConfig":
        for name, value, allowed in (("init", self.init, INITS), ("loss", self.loss, LOSSES),
                                     ("schedule", self.schedule, SCHEDULES)):
            if value not in allowed:
                raise VkvError(f"unknown {name} '{value}'; choose one of {', '.join(allowed)}")
        if self.steps < 0 or not self.lr > 0:
            raise VkvError(f"steps must be ≥ 0 and lr > 0, got steps={self.steps}, lr={self.lr}")
        return self


@dataclass
class OptimResult:
    embeddings: torch.Tensor  # [k, hidden] float32, the best found
    initial_loss: float
    best_loss: float
    final_loss: float
    per_layer_loss: list[float]  # at the best embeddings
    trace: list[float] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0
    stopped: str = "steps"

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("embeddings")
        d["seconds_per_step"] = self.seconds / max(self.steps, 1)
        return d


def initial_embeddings(lm: FrozenLM, targets: Targets, init: str, generator: torch.Generator) -> torch.Tensor:
    if init == "pooled":
        return targets.pooled_embeddings.clone()
    table = lm.embedding_matrix.float()
    if init == "mean":
        span_mean = (targets.pooled_embeddings.mean(0, keepdim=True)).expand(targets.k, -1)
        return span_mean.clone().cpu()
    noise = torch.randn(targets.k, table.shape[1], generator=generator)
    return noise * table.std().item()  # Cramming's init: Gaussian at the embedding table's scale


def layer_losses(keys: list[torch.Tensor], values: list[torch.Tensor], targets: Targets, loss: str) -> torch.Tensor:
    """Per-layer loss `[layers]` between the virtual tokens' K/V (lists of `[1, H, k, D]`) and the targets."""
    device = values[0].device
    v = torch.cat(values).float()  # [layers, H, k, D]
    per_layer = _distance(v, targets.values.to(device), targets.value_scale.to(device), loss)
    if targets.keys is not None:
        k = torch.cat(keys).float()
        per_layer = 0.5 * (per_layer + _distance(k, targets.keys.to(device), targets.key_scale.to(device), loss))
    return per_layer


def _distance(x: torch.Tensor, target: torch.Tensor, scale: torch.Tensor, loss: str) -> torch.Tensor:
    if loss == "cosine":
        return 1 - torch.nn.functional.cosine_similarity(x, target, dim=-1).mean(dim=(1, 2))
    return (x - target).pow(2).mean(dim=(1, 2, 3)) / scale


def virtual_kv(lm: FrozenLM, prefix: KVPrefix, embeddings: torch.Tensor, positions: torch.Tensor, target_kind: str):
    """Keys and values of the virtual tokens on top of the prefix; keys pre-RoPE when the target needs them."""
    keys, values = lm.forward_kv(embeddings.unsqueeze(0).to(lm.device), positions, prefix)
    if target_kind == "kv-pre-rope":
        keys = [lm.rotate(k, positions, inverse=True) for k in keys]
    return keys, values


def optimise(
    lm: FrozenLM,
    prefix: KVPrefix,
    targets: Targets,
    positions: torch.Tensor,
    config: OptimConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> OptimResult:
    """Adam on the virtual embeddings; keeps the best step, stops on plateau, recovers from non-finite loss."""
    config.validate()
    generator = torch.Generator().manual_seed(config.seed)
    embeddings = initial_embeddings(lm, targets, config.init, generator).to(lm.device).requires_grad_(True)
    optimiser = torch.optim.Adam([embeddings], lr=config.lr)

    def loss_now() -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = virtual_kv(lm, prefix, embeddings, positions, targets.kind)
        per_layer = layer_losses(keys, values, targets, config.loss)
        return per_layer.mean(), per_layer

    start = time.perf_counter()
    best = embeddings.detach().clone()
    best_loss, best_step, halvings, lr = math.inf, 0, 0, config.lr
    trace: list[float] = []
    stopped = "steps"
    for step in range(config.steps + 1):
        loss, _ = loss_now()
        value = loss.item()
        if not math.isfinite(value):
            halvings += 1
            if halvings > config.max_lr_halvings:
                stopped = f"non-finite loss at step {step} after {config.max_lr_halvings} learning-rate halvings"
                break
            with torch.no_grad():
                embeddings.copy_(best)
            lr /= 2
            optimiser = torch.optim.Adam([embeddings], lr=lr)
            continue
        trace.append(value)
        if on_step:
            on_step(step, value)
        if value < best_loss * (1 - config.min_rel_improvement):
            best_step = step
        if value < best_loss:
            best_loss = value
            best = embeddings.detach().clone()
        if step == config.steps:
            break
        if step - best_step >= config.patience:
            stopped = "plateau"
            break
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([embeddings], config.clip)
        for group in optimiser.param_groups:
            group["lr"] = _scheduled_lr(lr, step, config)
        optimiser.step()
    if not trace:
        raise VkvError("optimisation produced no finite loss; the span's targets or the model may be broken")
    with torch.no_grad():
        embeddings.copy_(best)
        _, per_layer = loss_now()
    return OptimResult(
        embeddings=best.float().cpu(),
        initial_loss=trace[0],
        best_loss=best_loss,
        final_loss=trace[-1],
        per_layer_loss=per_layer.tolist(),
        trace=trace,
        steps=len(trace) - 1,
        seconds=time.perf_counter() - start,
        stopped=stopped,
    )


def _scheduled_lr(base: float, step: int, config: OptimConfig) -> float:
    if config.schedule == "cosine" and config.steps > 0:
        return base * 0.5 * (1 + math.cos(math.pi * step / config.steps))
    return base
