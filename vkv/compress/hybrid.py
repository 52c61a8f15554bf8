"""Per-turn verbatim (the `hybrid` method, `--keep-verbatim` per turn): keep a turn's most distinctive tokens verbatim,
every head the same tokens, and compress the rest into virtual tokens (per-head verbatim, where each KV head keeps its
own entries, is `verbatim_share`: compress/head_hybrid.py).

Failures at high ratios are specific tokens (`bcryptjs` → `bcrypt`) whose signal is diluted by pooling.
A fraction of the span (default 15%) is therefore kept as real K/V entries at their original positions
(exact RoPE, exactly what the model computed), chosen by

- `v-uniqueness`: how far a token's V is from the mean V of its neighbours, relative to the layer's V
  scale, averaged over layers (the seed's better signal: it picks content words), or
- `surprisal`: −log p of the token (picks formatting markers and sub-word fragments too).

The remaining tokens are pooled into virtual tokens optimised on top of the prefix plus the kept entries.
Kept and virtual entries together meet the span's entry budget, so the achieved ratio counts both; the
segment's loss is the virtual part's (kept entries are exact).

Short spans: a verbatim share that is large next to the budget leaves the virtual tokens an extreme ratio
(at 4.8×, 15% verbatim leaves 85% of the tokens to 5.8% of the entries). Rule: verbatim entries take at
most `max_share` (default half) of the budget and at least one entry stays virtual; when the rule cuts the
verbatim count, a ShortTurnWarning says so and the segment's stats record it.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from vkv.compress.config import CompressConfig
from vkv.compress.pooling import surprisal_scores
from vkv.compress.single import virtual_segment
from vkv.compress.targets import target_kind
from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, interleaved
from vkv.lm.capture import Activations
from vkv.lm.frozen import FrozenLM
from vkv.settings import Config, check_ranges, setting

KEEP_BY = ("v-uniqueness", "surprisal")


class ShortTurnWarning(UserWarning):
    """The verbatim share was cut so the virtual tokens keep a workable part of a short span's budget."""


@dataclass
class HybridConfig(Config):
    """Which of a span's tokens stay verbatim beside its virtual tokens, and how many."""

    fraction: float = setting(
        0.15, "--verbatim shared: share of the span's tokens every head keeps verbatim", minimum=0, below=1
    )
    keep_by: str = setting("v-uniqueness", "--verbatim shared: which tokens every head keeps verbatim", KEEP_BY)
    max_share: float = setting(
        0.5, "--verbatim shared: the shared tokens take at most this share of a span's entry budget", minimum=0, below=1
    )
    neighbours: int = setting(2, "v-uniqueness compares a token with this many neighbours on each side", minimum=1)

    def validate(self) -> HybridConfig:
        check_ranges(self)
        return self


@dataclass
class HybridRecipe(CompressConfig):
    """The recipe of the virtual part beside shared verbatim tokens alone (`verbatim shared`): no per-head verbatim
    share by default, and one asked for is refused, naming the field and the mode that keeps both."""

    head_verbatim: ClassVar[bool] = False

    def validate(self) -> CompressConfig:
        compress = super().validate()
        if compress.verbatim_share:
            raise VkvError(
                "field verbatim_share: verbatim shared keeps one set of tokens for every head (--verbatim-fraction); "
                "give verbatim shared+per-head to keep each head's own share beside them, or verbatim_share 0"
            )
        return compress


# ---- which tokens stay verbatim -------------------------------------------------------------------


def v_uniqueness(values: torch.Tensor, neighbours: int = 2) -> torch.Tensor:
    """Per-token score `[n]`: distance of each token's V `[layers, heads, n, dim]` from the mean V of up to
    `neighbours` tokens on each side, divided by the layer's RMS V norm, averaged over layers."""
    layers, heads, n, dim = values.shape
    if n < 2:
        return torch.zeros(n)
    v = values.permute(0, 2, 1, 3).reshape(layers, n, heads * dim).float()
    total, count = torch.zeros_like(v), torch.zeros(n)
    for offset in range(1, min(neighbours, n - 1) + 1):
        total[:, offset:] += v[:, :-offset]
        count[offset:] += 1
        total[:, :-offset] += v[:, offset:]
        count[:-offset] += 1
    distance = (v - total / count[None, :, None]).norm(dim=-1)  # [layers, n]
    scale = v.pow(2).sum(-1).mean(-1).sqrt().clamp_min(1e-8)  # [layers]
    return (distance / scale[:, None]).mean(0).cpu()


def keep_scores(acts: Activations, config: HybridConfig) -> torch.Tensor:
    """Higher = more worth keeping verbatim, `[span]`."""
    if config.keep_by == "surprisal":
        return surprisal_scores(acts.surprisal.float())
    return v_uniqueness(acts.values, config.neighbours)


@dataclass(frozen=True)
class VerbatimShare:
    wanted: int  # fraction × span tokens
    kept: int  # after the short-span rule
    virtual: int  # entries left for virtual tokens

    @property
    def capped(self) -> bool:
        return self.kept < self.wanted


def verbatim_share(span_tokens: int, budget: int, config: HybridConfig) -> VerbatimShare:
    """The explicit short-span rule: kept ≤ max_share × budget and at least one virtual entry."""
    if not 1 <= budget <= span_tokens:
        raise VkvError(f"an entry budget of {budget} does not fit a span of {span_tokens} tokens")
    wanted = round(config.fraction * span_tokens)
    kept = max(0, min(wanted, int(config.max_share * budget), budget - 1))
    return VerbatimShare(wanted, kept, budget - kept)


def choose_verbatim(acts: Activations, share: VerbatimShare, config: HybridConfig) -> torch.Tensor:
    """Span-relative indices (sorted) of the tokens kept verbatim."""
    if share.kept == 0:
        return torch.zeros(0, dtype=torch.long)
    return torch.topk(keep_scores(acts, config), share.kept).indices.sort().values


# ---- the segment ----------------------------------------------------------------------------------


def hybrid_segment(
    lm: FrozenLM,
    ids: list[int],
    acts: Activations,
    span_kv: KVPrefix,
    prefix: KVPrefix,
    budget: int,
    compress: CompressConfig,
    config: HybridConfig,
    message_starts: list[int] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    token_scores: torch.Tensor | None = None,
) -> Segment:
    """`budget` entries for ids[acts.start:acts.end]: kept tokens' real K/V (`span_kv` holds the span's own
    K/V, `[1, kv_heads, span, head_dim]` per layer) plus, for the rest, virtual tokens optimised on top of the prefix
    and the kept entries (`virtual_segment`, with each head's own share among the rest when `compress` keeps one),
    sorted by position; `token_scores` `[layers, kv_heads, span]`: the reconstruction pass's importance of the span's
    tokens, when the recipe ranks the heads' shares by it. `compress`, `config`: validated."""
    if not target_kind(compress.target).order_free:
        raise VkvError(
            f"hybrid compression pools the remaining tokens out of order, so it supports targets "
            f"v and kv-pre-rope, not {compress.target}"
        )
    start, end = acts.start, acts.end
    share = verbatim_share(end - start, budget, config)
    if share.capped:
        warnings.warn(
            f"tokens {start}-{end}: keeping {share.wanted} tokens verbatim ({config.fraction:.0%}) would "
            f"take {share.wanted / budget:.0%} of the {budget}-entry budget; keeping {share.kept} so "
            f"virtual tokens get at least {1 - config.max_share:.0%} of it",
            ShortTurnWarning,
            stacklevel=2,
        )
    kept = choose_verbatim(acts, share, config)
    kept_kv = span_kv.select(kept)
    virtual = virtual_segment(
        lm, ids, acts, prefix.cat(kept_kv), compress, share.virtual, message_starts, None, on_step,
        token_scores=token_scores, span_kv=span_kv, shared=kept,
    )  # fmt: skip
    if compress.verbatim_share:  # each head's own entries beside the shared ones: one compact segment already
        virtual.stats.update(_shared_stats(lm, ids, acts, kept, share, config))
        return virtual
    return _assemble(lm, ids, acts, kept, kept_kv, virtual, share, config)


def _assemble(lm, ids, acts, kept, kept_kv, virtual: Segment, share: VerbatimShare, config) -> Segment:
    """The kept tokens' own entries (every head the same, bias 0: a verbatim token stands for itself) and the virtual
    part, sorted by position."""
    kept_ids = [ids[acts.start + int(i)] for i in kept]
    with torch.no_grad():
        kept_embeddings = lm.embed(torch.tensor(kept_ids, dtype=torch.long)).float().cpu()
    keys, values = torch.cat(kept_kv.keys), torch.cat(kept_kv.values)
    bias = None if virtual.bias is None else torch.zeros(*keys.shape[:3])
    positions = (kept + acts.start).float()
    own = Segment(
        "verbatim",
        virtual.span,
        keys,
        values,
        positions,
        kept_embeddings.reshape(len(kept_ids), kept_embeddings.shape[-1]),
        bias=bias,
    )
    segment, own_slots = interleaved(own, dataclasses.replace(virtual, separable=None))
    segment.stats.update(_shared_stats(lm, ids, acts, kept, share, config), verbatim_entries=own_slots.tolist())
    return segment


def _shared_stats(lm, ids, acts, kept, share: VerbatimShare, config: HybridConfig) -> dict:
    """What a segment records of its shared verbatim tokens."""
    return dict(
        keep_by=config.keep_by,
        verbatim_fraction=config.fraction,
        verbatim_kept=share.kept,
        verbatim_wanted=share.wanted,
        verbatim_capped=share.capped,
        virtual_entries=share.virtual,
        verbatim_positions=(kept + acts.start).tolist(),
        verbatim_text=[lm.tokenizer.decode([ids[acts.start + int(i)]]) for i in kept],
    )
