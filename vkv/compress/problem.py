"""SpanProblem: one span's optimisation problem, built by the recipe in one place.

blocks (which tokens each virtual token stands for) → pooling weights inside each block → targets (what the
virtual tokens' K/V must match) → positions (where they sit on the RoPE axis). Single-span compression,
hybrid, sequential compression and the speed benchmark all build their problems here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from vkv.compress.blocks import span_blocks
from vkv.compress.compaction import fit_bias
from vkv.compress.config import CompressConfig
from vkv.compress.head_budget import mask_per_head
from vkv.compress.pooling import Blocks, block_weights
from vkv.compress.positions import virtual_positions
from vkv.compress.targets import AttentionTargets, Targets, attention_targets, build_targets, target_kind
from vkv.errors import VkvError
from vkv.kv.segment import SeparableBias, mass_bias
from vkv.lm.capture import Activations, capture_span
from vkv.lm.frozen import FrozenLM


def needs_readout(config: CompressConfig) -> bool:
    """Whether the virtual tokens' biases read what the span's own queries attend to (fitted biases, head-wise shares
    ranked by them)."""
    return config.fit_bias or (config.head_budget.per_head and not config.needs_reconstruction)


def needs_queries(config: CompressConfig) -> bool:
    """Whether building the span's problem reads its own pre-RoPE queries: attention targets or the read-out."""
    return target_kind(config.target).needs_queries or needs_readout(config)


BIAS_QUERIES = 512  # reference queries per head for fit_bias and head-wise budgets: the count am uses


@dataclass
class SpanProblem:
    """k virtual tokens standing for (some of) the tokens of a span [start, end)."""

    blocks: Blocks  # over the pooled tokens: all of the span's, or the `tokens` subset
    weights: torch.Tensor  # [pooled tokens] pooling weights, summing to 1 within each block
    targets: Targets
    positions: torch.Tensor  # [k] float32 logical positions
    readout: AttentionTargets | None = None  # the span's own queries and the mass they give them (bias, budgets)
    readout_seconds: float = 0.0  # what building `readout` took (its share of the problem's time)
    token_scores: torch.Tensor | None = None  # [layers, kv_heads, pooled tokens] reconstruction importance

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
        token_scores: torch.Tensor | None = None,
    ) -> SpanProblem:
        """The problem for ids[acts.start:acts.end] (or only the span-relative `tokens` `[n]`, ascending: hybrid's
        non-verbatim ones) with k virtual tokens, laid out by `config`; `attention` `[span]` is a question's
        attention, for the question-aware pooling rule only; `token_scores` `[layers, kv_heads, span]` the
        reconstruction pass's importance of the span's tokens (all of them, also with `tokens`), for
        share_scores=reconstruction only."""
        start, end = acts.start, acts.end
        if config.proportional_attention is None or config.verbatim_share is None:
            raise VkvError("a span's problem needs a validated recipe: CompressConfig.validate() fills its defaults")
        if config.fit_bias and tokens is not None:  # the mass to fit would be the pooled tokens', not the span's
            raise VkvError("fit_bias is not implemented for spans kept partly verbatim (hybrid)")
        if config.needs_reconstruction and token_scores is None:
            raise VkvError(
                "share_scores=reconstruction ranks each head's share by the reconstruction pass's importance of the "
                "span's tokens, and this compression path did not run it; use share_scores=readout"
            )
        if needs_queries(config) and acts.queries_pre_rope is None:
            # One more forward, over the full uncompressed text: right for `acts` captured there, which is why a
            # running cache's online view brings its own queries (compress_turns).
            acts, _ = capture_span(lm, torch.tensor(ids[:end]), start, end, queries=True)
        pooled, pooled_ids = acts, torch.tensor(ids)
        if tokens is not None:
            pooled = Activations(
                acts.values[:, :, tokens], acts.keys_pre_rope[:, :, tokens], acts.surprisal[tokens], 0, len(tokens)
            )
            pooled_ids = torch.tensor(ids)[start + tokens]
            token_scores = None if token_scores is None else token_scores[:, :, tokens]
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
        started = time.perf_counter()
        readout = attention_targets(lm, acts, torch.zeros(1), BIAS_QUERIES) if needs_readout(config) else None
        seconds = time.perf_counter() - started
        return cls(blocks, weights, targets, positions, readout, seconds, token_scores)

    def mass(self, config: CompressConfig) -> torch.Tensor | None:
        """Tokens each virtual token stands for `[k]`, when later queries weigh entries by it."""
        return self.blocks.sizes() if config.proportional_attention else None

    def bias(
        self, config: CompressConfig, keys: torch.Tensor, budget: int
    ) -> tuple[torch.Tensor | None, SeparableBias | None]:
        """The virtual tokens' entry biases `[layers, kv_heads, k]` for their post-RoPE `keys`
        `[layers, kv_heads, k, head_dim]`: log(block size) with proportional attention; with head_budget uniform or
        adaptive, each KV head's tokens beyond its share of `budget` masked (−inf); with fit_bias, fitted for the
        tokens each head keeps. Second: the same bias as per-token and per-head numbers when it is their sum (a
        head-wise mask without fit_bias), which files store in a fraction of the bytes."""
        mass = self.mass(config)
        layers, kv_heads, k, dim = keys.shape
        bias = torch.zeros(layers, kv_heads, k) if mass is None else mass_bias(mass, layers, kv_heads)
        if not config.head_budget.per_head and not config.fit_bias:
            return (None if mass is None else bias), None
        rows = layers * kv_heads
        keys = keys.float().cpu().reshape(rows, k, dim)
        separable = None
        if config.head_budget.per_head:  # am's order: choose each head's entries, then (with fit_bias) fit their β
            if config.needs_reconstruction:
                scores = self.blocks.most(self.token_scores)
            else:  # each token's score in a head: the mean attention the span's own queries give it among the k
                queries = self.readout.queries.reshape(rows, -1, dim)
                scores = (queries @ keys.transpose(1, 2) + bias.reshape(rows, 1, k)).softmax(-1).mean(1)
            per_entry = bias[0, 0]  # shared by every layer and head until the mask
            separable = mask_per_head(scores.reshape(layers, kv_heads, k), per_entry, budget, config.head_budget)
            bias = separable.dense()
        if config.fit_bias:
            queries, log_mass = self.readout.queries.reshape(rows, -1, dim), self.readout.log_norm.reshape(rows, -1)
            bias = fit_bias(queries, log_mass, keys, bias.reshape(rows, k)).reshape(layers, kv_heads, k)
            separable = None
        return bias, separable
