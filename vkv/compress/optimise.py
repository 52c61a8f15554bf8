"""Tune k virtual input embeddings on a frozen model until their per-layer K/V match the targets.

One loop serves a single span (`optimise`) and a batch of independent spans (`optimise_batch`: padded to
one length, masked so padding is never attended to nor scored). Adam is written out so that every span
keeps its own step count, learning rate, gradient clipping, best copy and early stop, exactly as if it were
optimised alone. The forward pass does only what the loss needs: it stops at the deepest layer whose K/V
the loss weighs, attends to the prefix read-only, and the frozen weights get no gradients. The loss is
kv_loss.py's, the starting embeddings embedding_init.py's and the activations' precision precision.py's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from vkv.compress.embedding_init import INITS, initial_embeddings
from vkv.compress.kv_loss import LOSSES, Batch
from vkv.compress.precision import PRECISIONS, activation_dtype, autocast, uses_bf16
from vkv.compress.targets import Targets
from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.lm.frozen import FrozenLM
from vkv.settings import check_fields, check_ranges, setting

SCHEDULES = ("constant", "cosine")
ADAM_EPS = 1e-8  # torch.optim.Adam's


@dataclass
class OptimConfig:
    # Chosen on the dev split: fewer steps lost no retention the intervals separate while the time falls with them,
    # and more steps lower the loss but not retention. Evidence in evals/RESULTS.md, sections 'Virtual tokens
    # against the anchors' (levers 4, 6c and 6d) and 'Stage 1: one lever at a time, 3.2×' (optimisation budget).
    steps: int = setting(10, "Adam steps on the virtual embeddings", minimum=0)
    lr: float = setting(1e-2, "Adam's learning rate", minimum=0, above=True)
    init: str = setting(
        "lstsq", "pooled embeddings, then layer 0's V matched exactly (lstsq); or pooled, random, mean", INITS
    )
    loss: str = setting("mse", "variance-normalised MSE per layer, or 1 - cosine similarity per head vector", LOSSES)
    schedule: str = setting("constant", "learning-rate schedule", SCHEDULES)
    patience: int = setting(
        50, "stop when the best loss has not improved by --min-rel-improvement for this many steps", minimum=1
    )
    min_rel_improvement: float = setting(1e-3, "relative improvement that resets --patience", minimum=0)
    clip: float = setting(1.0, "gradient-norm clip", minimum=0, above=True)
    max_lr_halvings: int = setting(
        4, "times the learning rate is halved when a step makes the loss non-finite", minimum=0
    )
    seed: int = setting(0, "seed of the random init and of everything else a run draws", minimum=0)
    layer_weights: tuple[float, ...] | None = setting(
        None, "per-layer loss weights (default: equal); layers after the last nonzero weight are never run"
    )
    precision: str = setting(
        "auto",
        "activations in bf16 where its matmuls are fast (CUDA; CPUs with AMX for unquantised weights), "
        "else fp32; the embeddings being optimised stay fp32 either way",
        PRECISIONS,
    )
    betas: tuple[float, float] = setting(
        (0.8, 0.95), "Adam's betas; reach a given loss in fewer steps than 0.9,0.999", minimum=0, below=1
    )
    target_loss: float | None = setting(None, "stop as soon as the loss is at or below this", minimum=0)

    def __post_init__(self) -> None:
        check_fields(self)

    def validate(self) -> OptimConfig:
        check_ranges(self)
        if len(self.betas) != 2:
            raise VkvError(f"field betas: Adam takes two betas, got {len(self.betas)}")
        if self.layer_weights is not None and (min(self.layer_weights, default=-1) < 0 or not any(self.layer_weights)):
            raise VkvError("layer_weights must be non-negative with at least one positive weight")
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
    batch_size: int = 1  # spans optimised together; seconds is the whole batch's wall time

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("embeddings")
        d["seconds_per_step"] = self.seconds / max(self.steps, 1)
        return d


def optimise(
    lm: FrozenLM,
    prefix: KVPrefix,
    targets: Targets,
    positions: torch.Tensor,
    config: OptimConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> OptimResult:
    """Adam on the virtual embeddings; keeps the best step, stops on plateau, recovers from non-finite loss."""
    return optimise_batch(lm, [(prefix, targets, positions)], config, on_step)[0]


@dataclass
class _Progress:
    """One problem's bookkeeping: loss trace, best so far, learning rate, Adam step count, why it stopped."""

    lr: float
    trace: list[float] = field(default_factory=list)
    best_loss: float = math.inf
    best_step: int = 0
    halvings: int = 0
    adam_steps: int = 0
    stopped: str = "steps"

    def observe(self, step: int, value: float, config: OptimConfig) -> tuple[bool, str]:
        """Take this step's loss → (is it the best so far, what next: "step", "restart", "stop" or "hold")."""
        if not math.isfinite(value):
            self.halvings += 1
            if self.halvings > config.max_lr_halvings:
                self.stopped = f"non-finite loss at step {step} after {config.max_lr_halvings} learning-rate halvings"
                return False, "stop"
            self.lr, self.adam_steps = self.lr / 2, 0
            return False, "restart"  # from the best embeddings, with a fresh Adam state
        self.trace.append(value)
        if value < self.best_loss * (1 - config.min_rel_improvement):
            self.best_step = step
        improved = value < self.best_loss
        self.best_loss = min(self.best_loss, value)
        if config.target_loss is not None and value <= config.target_loss:
            self.stopped = "target"
            return improved, "stop"
        if step == config.steps:
            return improved, "hold"
        if step - self.best_step >= config.patience:
            self.stopped = "plateau"
            return improved, "stop"
        return improved, "step"


def optimise_batch(
    lm: FrozenLM,
    problems: list[tuple[KVPrefix, Targets, torch.Tensor]],
    config: OptimConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> list[OptimResult]:
    """`optimise` for several independent (prefix, targets, positions) problems in one padded batch.

    Each problem gets the result it would get alone (up to float rounding); problems that stop early leave
    the batch. `on_step(step, loss)` sees the mean loss of the problems still running.
    """
    config.validate()
    if not problems:
        return []
    start_time = time.perf_counter()
    batch = Batch.build(lm, problems, activation_dtype(lm, config.precision))
    weights, last_layer = _layer_weights(lm, config)
    descent = _Descent(_initial_batch(lm, problems, batch.sizes, config), batch.sizes, config)
    with lm.compute_weights(torch.bfloat16 if uses_bf16(lm, config.precision) else None):
        _descend(lm, batch, descent, weights, last_layer, on_step)
        with torch.no_grad(), autocast(lm, config.precision):
            per_layer_best = batch.per_layer_losses(lm, descent.best, config.loss, lm.spec.num_layers - 1).float().cpu()
    return descent.results(per_layer_best, time.perf_counter() - start_time)


def _layer_weights(lm: FrozenLM, config: OptimConfig) -> tuple[torch.Tensor, int]:
    """The loss's per-layer weights `[last_layer + 1]`, normalised to sum to 1, and the deepest layer they weigh
    (the forward pass stops there)."""
    num_layers = lm.spec.num_layers
    weights = torch.tensor(config.layer_weights or [1.0] * num_layers, dtype=torch.float32, device=lm.device)
    if weights.numel() != num_layers:
        raise VkvError(f"layer_weights has {weights.numel()} entries; the model has {num_layers} layers")
    last_layer = int(weights.nonzero().max())
    return weights[: last_layer + 1] / weights.sum(), last_layer


def _initial_batch(
    lm: FrozenLM, problems: list[tuple[KVPrefix, Targets, torch.Tensor]], sizes: list[int], config: OptimConfig
) -> torch.Tensor:
    """Each problem's initial embeddings in one fp32 tensor `[B, max(sizes), hidden]`, zero where padded; every
    problem draws from its own generator seeded alike, so it starts where it would alone."""
    x = torch.zeros(len(problems), max(sizes), lm.spec.hidden_size, device=lm.device)
    for b, (_, targets, positions) in enumerate(problems):
        generator = torch.Generator().manual_seed(config.seed)
        x[b, : sizes[b]] = initial_embeddings(lm, targets, config.init, generator, positions).detach()
    return x


class _Descent:
    """A batch's optimisation state: the fp32 master embeddings `x` `[B, n, hidden]`, each problem's best copy,
    Adam's moments and each problem's `_Progress`. Problem b owns rows `[b, :sizes[b]]` of every tensor."""

    def __init__(self, x: torch.Tensor, sizes: list[int], config: OptimConfig):
        self.x, self.sizes, self.config = x, sizes, config
        self.best, self.adam_m, self.adam_v = x.clone(), torch.zeros_like(x), torch.zeros_like(x)
        self.progress = [_Progress(lr=config.lr) for _ in sizes]

    def observe(self, step: int, running: list[int], values: list[float]) -> tuple[list[int], list[int]]:
        """Take the running problems' losses at `step`: keep each improved problem's embeddings as its best, send a
        problem whose loss was non-finite back to its best with a fresh Adam state. Returns the indices into
        `running` of the problems that take a step and the problems that stop."""
        stepping, leaving = [], []
        for i, (b, value) in enumerate(zip(running, values)):
            improved, action = self.progress[b].observe(step, value, self.config)
            if improved:
                self.best[b] = self.x[b]
            if action == "restart":
                self.x[b], self.adam_m[b], self.adam_v[b] = self.best[b], 0.0, 0.0
            elif action == "stop":
                leaving.append(b)
            elif action == "step":
                stepping.append(i)
        return stepping, leaving

    def update(self, b: int, grad: torch.Tensor, step: int) -> None:
        """One Adam step on problem b's embeddings from its gradient `[sizes[b], hidden]`, clipped by its own norm
        first; the update is the one torch.optim.Adam computes."""
        config, state, k = self.config, self.progress[b], self.sizes[b]
        beta1, beta2 = config.betas
        grad.mul_(min(1.0, config.clip / (float(grad.norm()) + 1e-6)))
        state.adam_steps += 1
        m, v, t = self.adam_m[b, :k], self.adam_v[b, :k], state.adam_steps
        m.lerp_(grad, 1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(ADAM_EPS)
        self.x[b, :k].addcdiv_(m, denom, value=-_scheduled_lr(state.lr, step, config) / (1 - beta1**t))

    def results(self, per_layer_best: torch.Tensor, seconds: float) -> list[OptimResult]:
        """One result per problem; `per_layer_best` `[B, layers]` holds the losses of the best embeddings."""
        if any(not state.trace for state in self.progress):
            raise VkvError("optimisation produced no finite loss; the span's targets or the model may be broken")
        return [
            OptimResult(
                embeddings=self.best[b, : self.sizes[b]].float().cpu(),
                initial_loss=state.trace[0],
                best_loss=state.best_loss,
                final_loss=state.trace[-1],
                per_layer_loss=per_layer_best[b].tolist(),
                trace=state.trace,
                steps=len(state.trace) - 1,
                seconds=seconds,
                stopped=state.stopped,
                batch_size=len(self.progress),
            )
            for b, state in enumerate(self.progress)
        ]


def _descend(
    lm: FrozenLM,
    batch: Batch,
    descent: _Descent,
    weights: torch.Tensor,
    last_layer: int,
    on_step: Callable[[int, float], None] | None,
) -> None:
    """The loop: score the running problems, let each decide whether it steps, restarts or stops, and step those
    that go on. A problem that stops leaves the batch, which is trimmed to the rest."""
    config, sizes = descent.config, batch.sizes
    running, sub = list(range(len(sizes))), batch
    for step in range(config.steps + 1):
        leaf = descent.x[running, : max(sizes[b] for b in running)].requires_grad_(True)  # a copy of the rows
        with autocast(lm, config.precision):
            per_layer = sub.per_layer_losses(lm, leaf, config.loss, last_layer)
        losses = (per_layer.float() * weights).sum(-1)  # [running]
        values = losses.detach().cpu().tolist()
        stepping, leaving = descent.observe(step, running, values)
        finite = [v for v in values if math.isfinite(v)]
        if on_step and finite:
            on_step(step, sum(finite) / len(finite))
        if not stepping:
            break
        losses[stepping].sum().backward()
        for i in stepping:
            descent.update(running[i], leaf.grad[i, : sizes[running[i]]], step)
        if leaving:
            running = [b for b in running if b not in leaving]
            sub = batch.select(running)


def _scheduled_lr(base: float, step: int, config: OptimConfig) -> float:
    if config.schedule == "cosine" and config.steps > 0:
        return base * 0.5 * (1 + math.cos(math.pi * step / config.steps))
    return base
