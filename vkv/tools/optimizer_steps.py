"""What `vkv bench optimizer` races: the span both contenders optimise, the straightforward reference loop, and
one step of vkv's optimiser.

The reference loop is what one writes first: every step clones the prefix cache, runs the whole model with
its LM head, reads the new tokens' V back from the cache, and steps torch's Adam with the same loss, learning
rate, clipping and pooled initialisation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from vkv.compress.budget import span_budget
from vkv.compress.config import CompressConfig
from vkv.compress.head_budget import HeadBudget
from vkv.compress.kv_loss import Batch, layer_losses
from vkv.compress.optimise import OptimConfig
from vkv.compress.precision import activation_dtype, autocast, uses_bf16
from vkv.compress.problem import SpanProblem
from vkv.compress.targets import Targets
from vkv.kv.prefix import KVPrefix
from vkv.lm.capture import capture_span
from vkv.lm.frozen import FrozenLM
from vkv.text.transcript import load_transcript, parse_turn_span, render


@dataclass
class Span:
    transcript: str
    start: int
    end: int
    prefix: KVPrefix  # views into the capture pass's cache, never modified
    targets: Targets
    positions: torch.Tensor

    @property
    def problem(self) -> tuple[KVPrefix, Targets, torch.Tensor]:
        return self.prefix, self.targets, self.positions


def prepare_span(lm: FrozenLM, transcript_path: str | Path, span: str, ratio: float) -> Span:
    """Render, capture the span, build its problem with the default recipe: what `vkv compress` optimises."""
    transcript = load_transcript(transcript_path)
    rendered = render(transcript, lm.tokenizer)
    start, end = rendered.token_span(*parse_turn_span(span, transcript))
    acts, cache = capture_span(lm, rendered.ids, start, end, keep_cache=True)
    # the optimiser's problem: the default recipe's targets and positions for `budget` virtual tokens; how each head
    # spends its share (and which entries stay verbatim) is not part of it
    config = replace(CompressConfig().validate(), head_budget=HeadBudget.SHARED)
    problem = SpanProblem.build(
        lm, rendered.ids, acts, span_budget(end - start, ratio), config, rendered.message_starts
    )
    prefix = KVPrefix.from_cache(cache, start)
    return Span(str(transcript_path), start, end, prefix, problem.targets, problem.positions)


def reference_losses(
    lm: FrozenLM,
    prefix: KVPrefix,
    targets: Targets,
    positions: torch.Tensor,
    embeddings: torch.Tensor,
    loss: str = "mse",
) -> torch.Tensor:
    """Per-layer losses `[layers]` computed the straightforward way: a clone of the prefix in a fresh cache,
    the whole model with its LM head, the new tokens' K/V read back from the cache."""
    cache = lm.new_cache()
    for layer, (k, v) in enumerate(zip(prefix.keys, prefix.values)):
        cache.update(k.clone(), v.clone(), layer)
    length, n = prefix.length, embeddings.shape[0]
    lm.model(
        inputs_embeds=embeddings[None].to(lm.device, lm.dtype),
        **lm.with_cache(cache),
        position_ids=positions.to(lm.device).float()[None],
        attention_mask=lm.causal_mask(length, n),
        use_cache=True,
    )
    new = KVPrefix.from_cache(cache).slice(length)
    keys, values = new.keys, new.values
    if not targets.spec.rope_keys:
        keys = [lm.rotate(k, positions, inverse=True) for k in keys]
    return layer_losses(keys, values, targets, loss)


def reference_optimise(
    lm: FrozenLM,
    prefix: KVPrefix,
    targets: Targets,
    positions: torch.Tensor,
    steps: int,
    lr: float,
    clip: float = 1.0,
    on_step: Callable[[int, float], None] | None = None,
) -> torch.Tensor:
    """The straightforward loop: torch's Adam from the pooled embeddings; returns the final embeddings."""
    embeddings = targets.pooled_embeddings.clone().to(lm.device).requires_grad_(True)
    optimiser = torch.optim.Adam([embeddings], lr=lr)
    for step in range(steps + 1):
        loss = reference_losses(lm, prefix, targets, positions, embeddings).mean()
        if on_step:
            on_step(step, loss.item())
        if step == steps:
            break
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([embeddings], clip)
        optimiser.step()
    return embeddings.detach()


def vkv_loss_and_grad(
    lm: FrozenLM,
    prefix: KVPrefix,
    targets: Targets,
    positions: torch.Tensor,
    embeddings: torch.Tensor,
    config: OptimConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss vkv's optimiser minimises (mean over layers) and its gradient, through vkv's own forward."""
    config = config or OptimConfig()
    batch = Batch.build(lm, [(prefix, targets, positions)], activation_dtype(lm, config.precision))
    leaf = embeddings[None].to(lm.device).float().requires_grad_(True)
    with lm.compute_weights(torch.bfloat16 if uses_bf16(lm, config.precision) else None):
        with autocast(lm, config.precision):
            loss = batch.per_layer_losses(lm, leaf, config.loss, lm.spec.num_layers - 1).float().mean()
        loss.backward()
    return loss.detach(), leaf.grad[0]


def vkv_step(lm: FrozenLM, span: Span, embeddings: torch.Tensor, config: OptimConfig) -> Callable[[], None]:
    """One optimiser step's forward and backward, as `optimise` runs it (batch built and, in bf16, weights
    copied once, outside the step)."""
    batch = Batch.build(lm, [span.problem], activation_dtype(lm, config.precision))

    def step():
        leaf = embeddings[None].to(lm.device).float().requires_grad_(True)
        with autocast(lm, config.precision):
            loss = batch.per_layer_losses(lm, leaf, config.loss, lm.spec.num_layers - 1).float().mean()
        loss.backward()

    return step
