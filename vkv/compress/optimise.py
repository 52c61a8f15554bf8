"""Tune k virtual input embeddings on a frozen model until their per-layer K/V match the targets.

One loop serves a single span (`optimise`) and a batch of independent spans (`optimise_batch`: padded to
one length, masked so padding is never attended to nor scored). Adam is written out so that every span
keeps its own step count, learning rate, gradient clipping, best copy and early stop, exactly as if it were
optimised alone. The forward pass does only what the loss needs: it stops at the deepest layer whose K/V
the loss weighs, attends to the prefix read-only, and the frozen weights get no gradients.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from vkv.compress.targets import TARGET_KINDS, AttentionTargets, Targets
from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.lm.frozen import FrozenLM
from vkv.settings import check_fields, check_ranges, setting

INITS = ("pooled", "random", "mean", "lstsq")
LOSSES = ("mse", "cosine")
SCHEDULES = ("constant", "cosine")
PRECISIONS = ("auto", "fp32", "bf16")
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
        (0.8, 0.95), "Adam's betas, each below 1; reach a given loss in fewer steps than 0.9,0.999", minimum=0
    )
    target_loss: float | None = setting(None, "stop as soon as the loss is at or below this", minimum=0)

    def __post_init__(self) -> None:
        check_fields(self)

    def validate(self) -> OptimConfig:
        if not all(0 <= b < 1 for b in self.betas) or len(self.betas) != 2:
            raise VkvError(f"Adam betas must be two numbers in [0, 1), got {self.betas}")
        check_ranges(self)
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


# ---- losses ---------------------------------------------------------------------------------------


def layer_losses(keys: list[torch.Tensor], values: list[torch.Tensor], targets: Targets, loss: str) -> torch.Tensor:
    """Per-layer loss `[layers]` between the virtual tokens' K/V (lists of `[1, H, k, D]`, keys post-RoPE
    unless the target is pre-RoPE) and the targets, read-out error included for attention targets."""
    device = values[0].device
    v = torch.cat(values).float()  # [layers, H, k, D]
    per_layer = _distance(v, targets.values.to(device), targets.value_scale.to(device), loss)
    if targets.keys is not None:
        k = torch.cat(keys).float()
        per_layer = 0.5 * (per_layer + _distance(k, targets.keys.to(device), targets.key_scale.to(device), loss))
    if targets.attention is not None:
        attention = AttentionBatch.build([targets.attention], targets.k, device)
        per_layer = (
            per_layer
            + _attention_distance(
                torch.cat(keys).float()[None], v[None], attention, targets.value_scale.to(device)[None]
            )[0]
        )
    return per_layer


def _distance(x: torch.Tensor, target: torch.Tensor, scale: torch.Tensor, loss: str) -> torch.Tensor:
    if loss == "cosine":
        return 1 - torch.nn.functional.cosine_similarity(x, target, dim=-1).mean(dim=(1, 2))
    return (x - target).pow(2).mean(dim=(1, 2, 3)) / scale


def _masked_distance(x, target, scale, loss: str, token_mask: torch.Tensor | None) -> torch.Tensor:
    """`layer_losses`' distance for a batch: x, target `[B, layers, H, n, D]`, scale `[B, layers]` → `[B, layers]`;
    padded tokens (token_mask `[B, n]` False) count for nothing."""
    if token_mask is None:
        if loss == "cosine":
            return 1 - torch.nn.functional.cosine_similarity(x, target, dim=-1).mean(dim=(2, 3))
        return (x - target).pow(2).mean(dim=(2, 3, 4)) / scale
    weight = token_mask.to(x.dtype)[:, None, None, :]  # [B, 1, 1, n]
    count = weight.sum(-1) * x.shape[2]  # real tokens × heads, [B, 1, 1]
    if loss == "cosine":
        cos = torch.nn.functional.cosine_similarity(x, target, dim=-1)
        return 1 - (cos * weight).sum(dim=(2, 3)) / count[..., 0]
    squared = (x - target).pow(2).sum(-1)
    return (squared * weight).sum(dim=(2, 3)) / (count[..., 0] * x.shape[-1]) / scale


def _attention_distance(
    keys: torch.Tensor, values: torch.Tensor, target: AttentionBatch, value_scale: torch.Tensor
) -> torch.Tensor:
    """Per-layer read-out error `[B, layers]` of virtual keys/values `[B, layers, kv_heads, n, D]` (post-RoPE):
    the output error (variance-normalised like the V loss) plus the squared log-normaliser error, in nats²,
    averaged over the reference queries."""
    depth = keys.shape[1]
    scores = target.queries[:, :depth] @ keys.transpose(-1, -2) + target.log_mass[:, None, None, None, :]
    outputs = scores.softmax(-1) @ values
    output_error = (outputs - target.outputs[:, :depth]).pow(2).mean(-1) / value_scale[:, :depth, None, None]
    norm_error = (scores.logsumexp(-1) - target.log_norm[:, :depth]).pow(2)
    error = output_error + norm_error  # [B, layers, kv_heads, queries]
    if target.query_mask is None:
        return error.mean(dim=(2, 3)) * target.weight[:, None]
    mask = target.query_mask.to(error.dtype)[:, None, None, :]
    return (error * mask).sum(dim=(2, 3)) / (mask.sum(-1) * error.shape[2]) * target.weight[:, None]


@dataclass
class AttentionBatch:
    """`AttentionTargets` of a batch, padded: absent virtual tokens get log-mass -inf (never read), absent
    reference queries a False `query_mask`."""

    queries: torch.Tensor  # [B, layers, kv_heads, q, D]
    outputs: torch.Tensor  # [B, layers, kv_heads, q, D]
    log_norm: torch.Tensor  # [B, layers, kv_heads, q]
    log_mass: torch.Tensor  # [B, n]
    query_mask: torch.Tensor | None  # [B, q]
    weight: torch.Tensor  # [B]

    @classmethod
    def build(cls, targets: list[AttentionTargets], n: int, device: torch.device) -> AttentionBatch:
        counts = [t.count for t in targets]
        q = max(counts)

        def pad(x: torch.Tensor, dim: int, size: int, fill: float = 0.0) -> torch.Tensor:
            shape = list(x.shape)
            shape[dim] = size - x.shape[dim]
            return torch.cat([x.float(), x.new_full(shape, fill).float()], dim=dim)

        return cls(
            queries=torch.stack([pad(t.queries, 2, q) for t in targets]).to(device),
            outputs=torch.stack([pad(t.outputs, 2, q) for t in targets]).to(device),
            log_norm=torch.stack([pad(t.log_norm, 2, q) for t in targets]).to(device),
            log_mass=torch.stack([pad(t.log_mass, 0, n, float("-inf")) for t in targets]).to(device),
            query_mask=None
            if len(set(counts)) == 1
            else (torch.arange(q)[None] < torch.tensor(counts)[:, None]).to(device),
            weight=torch.tensor([t.weight for t in targets], dtype=torch.float32, device=device),
        )

    def select(self, index: torch.Tensor, n: int) -> AttentionBatch:
        mask = None if self.query_mask is None else self.query_mask[index]
        return AttentionBatch(
            self.queries[index],
            self.outputs[index],
            self.log_norm[index],
            self.log_mass[index, :n],
            None if mask is None or bool(mask.all()) else mask,
            self.weight[index],
        )


# ---- a batch of problems --------------------------------------------------------------------------


@dataclass
class Batch:
    """Problems padded to one virtual-token count n and one prefix length, on the model's device."""

    prefix: KVPrefix
    positions: torch.Tensor  # [B, n]
    token_mask: torch.Tensor | None  # [B, n] True for real virtual tokens; None when none is padded
    values: torch.Tensor  # [B, layers, kv_heads, n, D]
    value_scale: torch.Tensor  # [B, layers]
    keys: torch.Tensor | None
    key_scale: torch.Tensor | None
    kind: str
    sizes: list[int]
    attention: AttentionBatch | None = None

    @classmethod
    def build(
        cls,
        lm: FrozenLM,
        problems: list[tuple[KVPrefix, Targets, torch.Tensor]],
        prefix_dtype: torch.dtype | None = None,
    ) -> Batch:
        kinds = {t.kind for _, t, _ in problems}
        if len(kinds) != 1:
            raise VkvError(f"a batch must share one target kind, got {', '.join(sorted(kinds))}")
        sizes = [t.k for _, t, _ in problems]
        n, dev = max(sizes), lm.device

        def padded(tensors: list[torch.Tensor], dim: int, fill: float = 0.0) -> torch.Tensor:
            out = []
            for x in tensors:
                pad = list(x.shape)
                pad[dim] = n - x.shape[dim]
                out.append(torch.cat([x, x.new_full(pad, fill)], dim=dim))
            return torch.stack(out).to(dev)

        prefixes = [p for p, _, _ in problems]
        prefix = prefixes[0] if len(prefixes) == 1 else KVPrefix.stack(prefixes)
        targets = [t for _, t, _ in problems]
        positions = [p.float().reshape(-1) for _, _, p in problems]
        with_keys = targets[0].keys is not None
        with_attention = targets[0].attention is not None
        return cls(
            prefix=prefix.to(dev, prefix_dtype or lm.dtype),
            positions=padded([p for p in positions], 0, fill=0.0),
            token_mask=None if len(set(sizes)) == 1 else (torch.arange(n)[None] < torch.tensor(sizes)[:, None]).to(dev),
            values=padded([t.values.float() for t in targets], 2),
            value_scale=torch.stack([t.value_scale.float() for t in targets]).to(dev),
            keys=padded([t.keys.float() for t in targets], 2) if with_keys else None,
            key_scale=torch.stack([t.key_scale.float() for t in targets]).to(dev) if with_keys else None,
            kind=targets[0].kind,
            sizes=sizes,
            attention=AttentionBatch.build([t.attention for t in targets], n, dev) if with_attention else None,
        )

    def select(self, rows: list[int]) -> Batch:
        """The sub-batch of `rows`, trimmed to their longest prefix and virtual-token count (one copy)."""
        n = max(self.sizes[r] for r in rows)
        index = torch.tensor(rows, device=self.positions.device)
        prefix = self.prefix
        if prefix.length and prefix.keys[0].shape[0] > 1:
            valid = prefix.valid[index] if prefix.valid is not None else None
            length = int(valid.sum(1).max()) if valid is not None else prefix.length
            valid = None if valid is None or bool(valid[:, :length].all()) else valid[:, :length]
            bias = None if prefix.bias is None else [b[index, :, :length] for b in prefix.bias]
            prefix = KVPrefix(
                [k[index, :, :length] for k in prefix.keys], [v[index, :, :length] for v in prefix.values], valid, bias
            )
        mask = None if self.token_mask is None else self.token_mask[index, :n]
        return Batch(
            prefix=prefix,
            positions=self.positions[index, :n],
            token_mask=None if mask is None or bool(mask.all()) else mask,
            values=self.values[index, :, :, :n],
            value_scale=self.value_scale[index],
            keys=None if self.keys is None else self.keys[index, :, :, :n],
            key_scale=None if self.key_scale is None else self.key_scale[index],
            kind=self.kind,
            sizes=[self.sizes[r] for r in rows],
            attention=None if self.attention is None else self.attention.select(index, n),
        )

    def per_layer_losses(self, lm: FrozenLM, embeddings: torch.Tensor, loss: str, last_layer: int) -> torch.Tensor:
        """Per-problem, per-layer loss `[B, last_layer + 1]` of embeddings `[B, n, hidden]`."""
        keys, values = lm.forward_kv(
            embeddings,
            self.positions,
            self.prefix,
            last_layer=last_layer,
            token_mask=self.token_mask,
            last_keys=TARGET_KINDS[self.kind].uses_keys,
            rope_keys=TARGET_KINDS[self.kind].rope_keys,
        )
        depth = last_layer + 1
        stacked_values = torch.stack(values, 1).float()
        per_layer = _masked_distance(
            stacked_values, self.values[:, :depth], self.value_scale[:, :depth], loss, self.token_mask
        )
        if self.attention is not None:
            per_layer = per_layer + _attention_distance(
                torch.stack(keys, 1).float(), stacked_values, self.attention, self.value_scale
            )
        if self.keys is not None:
            key_loss = _masked_distance(
                torch.stack(keys, 1).float(), self.keys[:, :depth], self.key_scale[:, :depth], loss, self.token_mask
            )
            per_layer = 0.5 * (per_layer + key_loss)
        return per_layer


# ---- initialisation -------------------------------------------------------------------------------


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


# ---- the loop ---------------------------------------------------------------------------------------


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


def uses_bf16(lm: FrozenLM, precision: str) -> bool:
    """bf16 activations when asked, or by default where bf16 matmuls are fast: CUDA, and CPUs with AMX tiles
    for unquantised weights (int8 layers gain nothing there: bitsandbytes quantises activations anyway)."""
    if precision != "auto":
        return precision == "bf16"
    if lm.device.type == "cuda":
        return True
    return lm.device.type == "cpu" and lm.quant in ("fp32", "bf16", "fp16") and cpu_has_amx()


def cpu_has_amx() -> bool:
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False


def activation_dtype(lm: FrozenLM, precision: str) -> torch.dtype:
    return torch.bfloat16 if uses_bf16(lm, precision) else lm.dtype


def autocast(lm: FrozenLM, precision: str):
    """bf16 autocast for activations where `uses_bf16`; the fp32 master embeddings are untouched."""
    if uses_bf16(lm, precision):
        return torch.autocast(device_type=lm.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _scheduled_lr(base: float, step: int, config: OptimConfig) -> float:
    if config.schedule == "cosine" and config.steps > 0:
        return base * 0.5 * (1 + math.cos(math.pi * step / config.steps))
    return base
