"""SpanProblem: one span's optimisation problem, built by the recipe in one place.

blocks (which tokens each virtual token stands for) → pooling weights inside each block → targets (what the
virtual tokens' K/V must match) → positions (where they sit on the RoPE axis). Single-span compression,
hybrid, sequential compression and the speed benchmark all build their problems here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.blocks import span_blocks
from vkv.compress.config import CompressConfig
from vkv.compress.pooling import Blocks, block_weights
from vkv.compress.positions import virtual_positions
from vkv.compress.targets import Targets, build_targets, target_kind
from vkv.lm.capture import Activations, capture_span
from vkv.lm.frozen import FrozenLM


@dataclass
class SpanProblem:
    """k virtual tokens standing for (some of) the tokens of a span [start, end)."""

    blocks: Blocks  # over the pooled tokens: all of the span's, or the `tokens` subset
    weights: torch.Tensor  # [pooled tokens] pooling weights, summing to 1 within each block
    targets: Targets
    positions: torch.Tensor  # [k] float32 logical positions

    @property
    def k(self) -> int:
        return self.blocks.count

    @classmethod
    def build(
        cls,
        lm: FrozenLM,
        ids: list[int],
        acts: Activations,
        k: int,
        config: CompressConfig,
        message_starts: list[int] | None = None,
        attention: torch.Tensor | None = None,
        tokens: torch.Tensor | None = None,
    ) -> SpanProblem:
        """The problem for ids[acts.start:acts.end] (or only the span-relative `tokens` `[n]`, ascending: hybrid's
        non-verbatim ones) with k virtual tokens, laid out by `config`; `attention` `[span]` is a question's
        attention, for the question-aware pooling rule only."""
        start, end = acts.start, acts.end
        kind = target_kind(config.target)
        if kind.needs_queries and acts.queries_pre_rope is None:  # one more forward, only when needed
            acts, _ = capture_span(lm, torch.tensor(ids[:end]), start, end, queries=True)
        pooled, pooled_ids = acts, torch.tensor(ids)
        if tokens is not None:
            pooled = Activations(
                acts.values[:, :, tokens], acts.keys_pre_rope[:, :, tokens], acts.surprisal[tokens], 0, len(tokens)
            )
            pooled_ids = torch.tensor(ids)[start + tokens]
        blocks = span_blocks(lm, ids, start, end, k, config, pooled.surprisal, message_starts, tokens=tokens)
        weights = block_weights(config.pooling, blocks, pooled.surprisal, attention)
        targets = build_targets(
            lm,
            pooled_ids,
            pooled,
            blocks,
            weights,
            config.target,
            config.proportional_attention,
            attention_weight=config.attention_weight,
        )
        token_positions = torch.arange(start, end) if tokens is None else start + tokens
        positions = virtual_positions(config.positions, start, end, k, blocks.centres(token_positions))
        return cls(blocks, weights, targets, positions)

    def mass(self, config: CompressConfig) -> torch.Tensor | None:
        """Tokens each virtual token stands for `[k]`, when later queries weigh entries by it."""
        return self.blocks.sizes() if config.proportional_attention else None
