"""Training (LaMR §3.3, App. D.5): fused CRF-NLL + λ·Σ w_r rubric CRF-NLL + score MSE + gate balance.

Each CRF-NLL is divided by the row's number of code tokens (as SWE-Pruner does), then averaged over rows.
The fused CRF learns the teacher's lines (`teacher`) or, when a dependency rubric is trained, the
teacher's lines plus their dependency support (`denoised`, the paper's AST-based label denoising); the
choice is `TrainConfig.target`. With one rubric the model is SWE-Pruner: its CRF is the decision CRF and
there is no rubric term and no gate. The score MSE only moves parameters when backbone layers train: the
relevance head is the backbone's own yes/no judgment.

AdamW over the trainable parameters (head + unfrozen top backbone layers), linear warm-up then cosine
decay, gradient clipping; validation token F1 (fused Viterbi vs the fused target) after every epoch, and
the best epoch's weights are the ones returned and saved. With a frozen backbone every example's features
are computed once and cached, so an epoch only runs the head.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from vkv.backends.lamr.crf import KEEP, LinearChainCRF
from vkv.backends.lamr.dataset import EncodedSet, Example, cache_features
from vkv.backends.lamr.inference import pad_batch, pad_token_id
from vkv.backends.lamr.model import LaMRModel, LaMROutput, gate_balance_loss
from vkv.errors import VkvError

LABELLED_RUBRICS = ("semantic", "dependency")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 3
    batch_size: int = 16
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_fraction: float = 0.1
    rubric_lambda: float = 0.6
    rubric_weights: tuple[float, ...] = (1.0, 0.7)
    score_weight: float = 0.05
    gate_weight: float = 0.002
    target: str | None = None  # fused target; None: "denoised" with a dependency rubric, else "teacher"
    bf16_autocast: bool = False  # run the head's matmuls in bfloat16 (fast on CPUs with AMX/AVX512-BF16)
    max_grad_norm: float = 1.0
    crf_lr_scale: float = 1.0  # CRF potentials are a handful of scalars in nats; short runs need them faster
    feature_batch_size: int = 4
    seed: int = 0

    def fused_target(self, rubrics: tuple[str, ...]) -> str:
        if self.target is not None:
            return self.target
        return "denoised" if "dependency" in rubrics else "teacher"

    def check(self, rubrics: tuple[str, ...]) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise VkvError(f"epochs and batch_size must be ≥ 1, got {self.epochs} and {self.batch_size}")
        if self.target not in (None, "teacher", "denoised", "semantic"):
            raise VkvError(f"training target must be teacher, denoised or semantic, got '{self.target}'")
        if len(rubrics) > 1:
            unknown = [r for r in rubrics if r not in LABELLED_RUBRICS]
            if unknown:
                raise VkvError(
                    f"rubrics {unknown} have no labels; with several rubrics use {', '.join(LABELLED_RUBRICS)}"
                )
            if len(self.rubric_weights) != len(rubrics):
                raise VkvError(f"rubric_weights has {len(self.rubric_weights)} values for {len(rubrics)} rubrics")


@dataclass
class Batch:
    attention: torch.Tensor  # [B, T]
    code_mask: torch.Tensor  # [B, T] bool
    targets: dict[str, torch.Tensor]  # kind → [B, T] long, 0 off the code
    score: torch.Tensor  # [B]
    input_ids: torch.Tensor | None = None
    features: torch.Tensor | None = None
    answer_logits: torch.Tensor | None = None


@dataclass
class TrainSummary:
    fused_target: str
    train_examples: int
    val_examples: int
    steps: int = 0
    seconds: float = 0.0
    feature_seconds: float = 0.0
    best_epoch: int = 0
    best_val: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def make_batch(examples: list[Example], pad_id: int, device: torch.device) -> Batch:
    ids, attention = pad_batch([e.chunk.input_ids for e in examples], pad_id, device)
    width = ids.shape[1]
    code = torch.zeros_like(attention, dtype=torch.bool)
    targets = {kind: torch.zeros_like(ids) for kind in examples[0].targets}
    for row, example in enumerate(examples):
        span = slice(example.chunk.code_start, example.chunk.code_start + example.chunk.code_len)
        code[row, span] = True
        for kind, values in example.targets.items():
            targets[kind][row, span] = torch.tensor(values, dtype=torch.long, device=device)
    score = torch.tensor([e.score for e in examples], dtype=torch.float32, device=device)
    batch = Batch(attention, code, targets, score, input_ids=ids)
    if all(e.features is not None for e in examples):
        features = torch.zeros(len(examples), width, examples[0].features.shape[-1], device=device)
        for row, example in enumerate(examples):
            features[row, : example.features.shape[0]] = example.features.to(device, torch.float32)
        batch.features = features
        batch.answer_logits = torch.stack([e.answer_logits for e in examples]).to(device)
    return batch


def forward(model: LaMRModel, batch: Batch, autocast: bool = False) -> LaMROutput:
    device_type = batch.attention.device.type
    with torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=autocast):
        if batch.features is not None:
            return model.run_head(batch.features, batch.attention, batch.answer_logits)
        return model(batch.input_ids, batch.attention)


def loss_terms(model: LaMRModel, output: LaMROutput, batch: Batch, config: TrainConfig) -> dict[str, torch.Tensor]:
    rubrics = model.head.rubrics
    mask = batch.code_mask
    lengths = mask.sum(dim=1).clamp(min=1).float()
    target = batch.targets[config.fused_target(rubrics)]
    fused = output.head.fused.float()
    terms = {"fused": (model.head.decision_crf.nll(fused, target, mask) / lengths).mean()}
    if len(rubrics) > 1:
        rubric_loss = fused.new_zeros(())
        for i, (name, weight) in enumerate(zip(rubrics, config.rubric_weights)):
            emissions = output.head.rubric_emissions[:, :, i].float()
            rubric_loss = (
                rubric_loss
                + weight * (model.head.crfs[name].nll(emissions, batch.targets[name], mask) / lengths).mean()
            )
        terms["rubric"] = rubric_loss
        terms["gate"] = gate_balance_loss(output.head.gate.float(), mask)
    terms["score"] = ((output.relevance - batch.score) ** 2).mean()
    terms["total"] = (
        terms["fused"]
        + config.rubric_lambda * terms.get("rubric", 0.0)
        + config.score_weight * terms["score"]
        + config.gate_weight * terms.get("gate", 0.0)
    )
    return terms


@torch.no_grad()
def validation_f1(model: LaMRModel, encoded: EncodedSet, config: TrainConfig, batch_size: int = 8) -> dict[str, float]:
    """Token precision/recall/F1 of the fused Viterbi path against the fused target, micro-averaged."""
    model.eval()
    target_kind = config.fused_target(model.head.rubrics)
    tp = fp = fn = 0
    for batch in _batches(encoded.examples, batch_size, pad_token_id(model), model.device, shuffle=False):
        output = forward(model, batch, config.bf16_autocast)
        decisions = model.head.decision_crf.viterbi(output.head.fused.float(), batch.code_mask) == KEEP
        gold = batch.targets[target_kind] == KEEP
        mask = batch.code_mask
        tp += int((decisions & gold & mask).sum())
        fp += int((decisions & ~gold & mask).sum())
        fn += int((~decisions & gold & mask).sum())
    return prf(tp, fp, fn)


def prf(tp: int, fp: int, fn: int) -> dict[str, float]:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def fit(
    model: LaMRModel,
    train_set: EncodedSet,
    val_set: EncodedSet | None,
    config: TrainConfig = TrainConfig(),
    log: Callable[[str], None] = print,
    show_progress: bool = True,
) -> TrainSummary:
    """Train `model` in place; returns the summary and leaves the best epoch's weights loaded."""
    rubrics = model.head.rubrics
    config.check(rubrics)
    summary = TrainSummary(
        config.fused_target(rubrics), len(train_set.examples), len(val_set.examples) if val_set else 0
    )
    start = time.perf_counter()
    if model.backbone_frozen:
        sets = [s for s in (train_set, val_set) if s is not None and not s.cached]
        total = sum(len(s.examples) for s in sets)
        if total:
            with _progress(total, "backbone features", show_progress) as advance:
                for encoded in sets:
                    cache_features(model.backbone, encoded, pad_token_id(model), config.feature_batch_size, advance)
        summary.feature_seconds = time.perf_counter() - start
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(_parameter_groups(model, config), lr=config.lr, weight_decay=config.weight_decay)
    steps_per_epoch = math.ceil(len(train_set.examples) / config.batch_size)
    scheduler = _warmup_cosine(optimizer, steps_per_epoch * config.epochs, config.warmup_fraction)
    rng = random.Random(config.seed)
    best_f1, best_state = -1.0, None
    for epoch in range(1, config.epochs + 1):
        model.train()
        totals: dict[str, float] = {}
        with _progress(steps_per_epoch, f"epoch {epoch}/{config.epochs}", show_progress) as advance:
            for batch in _batches(train_set.examples, config.batch_size, pad_token_id(model), model.device, rng=rng):
                terms = loss_terms(model, forward(model, batch, config.bf16_autocast), batch, config)
                optimizer.zero_grad(set_to_none=True)
                terms["total"].backward()
                torch.nn.utils.clip_grad_norm_(parameters, config.max_grad_norm)
                optimizer.step()
                scheduler.step()
                summary.steps += 1
                for key, value in terms.items():
                    totals[key] = totals.get(key, 0.0) + float(value.detach())
                advance(1)
        entry = {"epoch": epoch, **{f"loss_{k}": v / steps_per_epoch for k, v in totals.items()}}
        if val_set is not None and val_set.examples:
            entry.update({f"val_{k}": v for k, v in validation_f1(model, val_set, config).items()})
        summary.history.append(entry)
        log(" ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items()))
        f1 = entry.get("val_f1", -entry["loss_total"])
        if f1 > best_f1:
            best_f1, best_state, summary.best_epoch = f1, _trainable_state(model), epoch
            summary.best_val = {k[4:]: v for k, v in entry.items() if k.startswith("val_")}
    if best_state is not None:
        _restore(model, best_state)
    model.eval()
    summary.seconds = time.perf_counter() - start
    return summary


# ---- helpers ------------------------------------------------------------------------------------------
def _batches(examples, batch_size, pad_id, device, shuffle=True, rng: random.Random | None = None):
    """Batches of similar length (less padding): sort by length, cut, then shuffle the batch order."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].chunk.input_ids))
    if shuffle:
        rng = rng or random.Random(0)
        # jitter within neighbourhoods so batches differ between epochs
        order = sorted(order, key=lambda i: len(examples[i].chunk.input_ids) * (1 + 0.1 * rng.random()))
    groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if shuffle:
        rng.shuffle(groups)
    for group in groups:
        yield make_batch([examples[i] for i in group], pad_id, device)


def _parameter_groups(model: LaMRModel, config: TrainConfig) -> list[dict]:
    crf_ids = {id(p) for m in model.head.modules() if isinstance(m, LinearChainCRF) for p in m.parameters()}
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trainable if id(p) not in crf_ids]}]
    crf = [p for p in trainable if id(p) in crf_ids]
    if crf:
        groups.append({"params": crf, "lr": config.lr * config.crf_lr_scale, "weight_decay": 0.0})
    return groups


def _warmup_cosine(optimizer, total_steps: int, warmup_fraction: float):
    warmup = max(1, int(total_steps * warmup_fraction))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _trainable_state(model: LaMRModel) -> dict[str, torch.Tensor]:
    state = {f"head.{k}": v.detach().clone() for k, v in model.head.state_dict().items()}
    named = dict(model.backbone.model.named_parameters())
    state.update({f"backbone.{n}": named[n].detach().clone() for n in model.trainable_backbone_parameters})
    return state


def _restore(model: LaMRModel, state: dict[str, torch.Tensor]) -> None:
    model.head.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")})
    named = dict(model.backbone.model.named_parameters())
    with torch.no_grad():
        for key, value in state.items():
            if key.startswith("backbone."):
                named[key[len("backbone.") :]].copy_(value)


class _progress:
    """A rich progress bar (or nothing); the context value is `advance(n)`."""

    def __init__(self, total: int, description: str, show: bool):
        self.total, self.description, self.show = total, description, show
        self.bar = None

    def __enter__(self):
        if not self.show:
            return lambda n=1: None
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        self.bar.start()
        task = self.bar.add_task(self.description, total=self.total)
        return lambda n=1: self.bar.advance(task, n)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
