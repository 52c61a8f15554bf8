"""Compress one span of a rendered conversation into virtual tokens and splice them into a cache.

One forward pass over the uncompressed text up to the span's end gives the prefix K/V, the span's per-layer
V (and pre-RoPE K) and per-token surprisal. Pooled targets are matched by optimising k virtual embeddings;
tokens after the span (if any) are re-encoded on top of the compressed cache at their original positions,
so nothing they carry was computed with the uncompressed span in view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from vkv.compress.distill import DistillConfig, build_probes, distill
from vkv.compress.optimise import OptimConfig, optimise
from vkv.compress.pooling import Blocks, block_mass, block_weights, num_virtual_tokens, partition, partition_by_mass
from vkv.compress.positions import virtual_positions
from vkv.compress.targets import build_targets
from vkv.errors import VkvError
from vkv.kv.context import Context
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.capture import capture_span
from vkv.lm.frozen import FrozenLM

BOUNDARIES = ("equal", "lines", "surprisal")


@dataclass
class CompressConfig:
    ratio: float = 3.2
    pooling: str = "surprisal"
    positions: str = "centres"  # each virtual token at the mean position of the tokens it stands for
    target: str = "v"
    attention_weight: float = 1.0  # target v+attention: weight of the read-out error next to the V loss
    boundaries: str = "surprisal"  # blocks of equal surprisal mass; or "equal" token counts, or snapped to "lines"
    mass_floor: float = 0.0  # boundaries "surprisal": each token's mass is its surprisal + this × the span's mean
    proportional_attention: bool = True  # later queries weigh each virtual token by its block's token count
    # (evals/RESULTS.md stage 1: retention 0.372 → 0.477 at 3.2×, better on three of four transcripts)
    optim: OptimConfig = field(default_factory=OptimConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)  # a KL stage after the V match (off by default)

    def validate(self) -> CompressConfig:
        """One clear error naming the field for a setting no compression path accepts."""
        from vkv.compress.pooling import POOLING_RULES
        from vkv.compress.positions import POSITION_SCHEMES
        from vkv.compress.targets import TARGET_KINDS

        for what, value, allowed in (
            ("pooling", self.pooling, POOLING_RULES),
            ("positions", self.positions, POSITION_SCHEMES),
            ("target", self.target, TARGET_KINDS),
            ("boundaries", self.boundaries, BOUNDARIES),
        ):
            if value not in allowed:
                raise VkvError(f"field {what}: unknown value '{value}'; choose one of {', '.join(allowed)}")
        if not self.mass_floor >= 0:
            raise VkvError(f"field mass_floor: must be ≥ 0, got {self.mass_floor}")
        if not self.attention_weight >= 0:
            raise VkvError(f"field attention_weight: must be ≥ 0, got {self.attention_weight}")
        self.optim.validate()
        self.distill.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompressConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise VkvError(f"unknown compression setting(s): {', '.join(sorted(unknown))}")
        nested = {}
        for name, kind in (("optim", OptimConfig), ("distill", DistillConfig)):
            given = d.get(name, {})
            unknown_nested = set(given) - {f.name for f in fields(kind)}
            if unknown_nested:
                raise VkvError(f"unknown {name} setting(s): {', '.join(sorted(unknown_nested))}")
            nested[name] = kind(**{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})
        return cls(**{**d, **nested})


def line_cuts(lm: FrozenLM, ids: list[int], start: int, end: int, message_starts: list[int]) -> list[int]:
    """Span-relative indices where a block may start: after a newline token, or at a message start."""
    cuts = {m - start for m in message_starts if start < m < end}
    for i, tid in enumerate(ids[start : end - 1]):
        if "\n" in lm.tokenizer.decode([tid]):
            cuts.add(i + 1)
    return sorted(cuts)


def span_blocks(
    lm: FrozenLM,
    ids: list[int],
    start: int,
    end: int,
    k: int,
    config: CompressConfig,
    surprisal: torch.Tensor,
    message_starts: list[int] | None = None,
    tokens: torch.Tensor | None = None,
) -> Blocks:
    """The k blocks, laid out by `config.boundaries`, of the tokens of ids[start:end] that k virtual tokens
    stand for: all of them, or only `tokens` `[n]` (ascending span-relative indices, e.g. hybrid's
    non-verbatim ones). `surprisal` holds those tokens' surprisal; with boundaries 'surprisal' every block
    gets an equal share of it, so informative stretches get more virtual tokens."""
    if config.boundaries not in BOUNDARIES:
        raise VkvError(f"unknown block boundaries '{config.boundaries}'; choose one of {', '.join(BOUNDARIES)}")
    if config.boundaries == "surprisal":
        return partition_by_mass(block_mass(surprisal, config.mass_floor), k)
    cuts = None
    if config.boundaries == "lines":
        cuts = line_cuts(lm, ids, start, end, message_starts or [])
        if tokens is not None:  # a cut before original token c falls before the first kept token at or after c
            cuts = sorted(set(torch.searchsorted(tokens, torch.tensor(cuts, dtype=torch.long)).tolist()))
    return partition(end - start if tokens is None else len(tokens), k, cuts)


def virtual_segment(
    lm: FrozenLM,
    ids: list[int],
    acts,
    prefix: KVPrefix,
    config: CompressConfig,
    message_starts: list[int] | None = None,
    attention: torch.Tensor | None = None,
    on_step: Callable[[int, float], None] | None = None,
    teacher: KVPrefix | None = None,
) -> Segment:
    """Optimise virtual tokens standing for ids[acts.start:acts.end] on top of `prefix`; with a distillation
    stage, `teacher` holds the full-context K/V of ids[:acts.end] (computed here when not given)."""
    start, end = acts.start, acts.end
    k = num_virtual_tokens(end - start, config.ratio)
    blocks = span_blocks(lm, ids, start, end, k, config, acts.surprisal, message_starts)
    weights = block_weights(config.pooling, blocks, acts.surprisal, attention)
    if config.target == "v+attention" and acts.queries_pre_rope is None:  # one more forward, only when needed
        acts, _ = capture_span(lm, torch.tensor(ids[:end]), start, end, queries=True)
    targets = build_targets(
        lm,
        torch.tensor(ids),
        acts,
        blocks,
        weights,
        config.target,
        config.proportional_attention,
        attention_weight=config.attention_weight,
    )
    positions = virtual_positions(config.positions, start, end, k, blocks.centres(torch.arange(start, end)))
    result = optimise(lm, prefix, targets, positions, config.optim, on_step=on_step)
    embeddings, stats = result.embeddings, result.summary()
    if config.distill.validate().steps:
        if teacher is None:
            _, cache = capture_span(lm, torch.tensor(ids[:end]), start, end, keep_cache=True)
            teacher = KVPrefix.from_cache(cache)
        probes = build_probes(lm, ids, end, teacher, config.distill)
        embeddings, trace = distill(lm, prefix, embeddings, positions, end, probes, config.distill)
        stats["distill"] = {
            "probe_tokens": [len(p.ids) for p in probes],
            "initial_kl": trace[0],
            "best_kl": min(trace),
            "trace": trace,
        }
    with torch.no_grad():
        keys, values = lm.forward_kv(embeddings[None].to(lm.device), positions, prefix)
    mass = blocks.sizes() if config.proportional_attention else None
    return Segment(
        "virtual",
        (start, end),
        torch.cat(keys).float().cpu(),
        torch.cat(values).float().cpu(),
        positions,
        embeddings,
        stats=stats,
        mass=mass,
    )


def compress(
    lm: FrozenLM,
    ids: list[int],
    start: int,
    end: int,
    config: CompressConfig,
    message_starts: list[int] | None = None,
    attention: torch.Tensor | None = None,
    on_step: Callable[[int, float], None] | None = None,
) -> SplicedCache:
    """Prefix verbatim, [start, end) virtual, everything after re-encoded on top: a SplicedCache of `ids`."""
    if not 0 <= start < end <= len(ids):
        raise VkvError(f"span [{start}, {end}) is empty or outside the {len(ids)} rendered tokens")
    acts, full_cache = capture_span(lm, torch.tensor(ids), start, end, keep_cache=True)
    prefix = KVPrefix.from_cache(full_cache, start)
    segment = virtual_segment(
        lm, ids, acts, prefix, config, message_starts, attention, on_step, teacher=KVPrefix.from_cache(full_cache, end)
    )
    spliced = SplicedCache()
    if start > 0:
        spliced.append(verbatim_segment(full_cache, 0, start))
    spliced.append(segment)
    if end < len(ids):
        spliced.append(reencode(lm, spliced, ids[end:]))
    return spliced


def reencode(lm: FrozenLM, spliced: SplicedCache, ids: list[int]) -> Segment:
    """Verbatim K/V of `ids` computed on top of the spliced cache at its next logical positions."""
    context = Context(lm, spliced)
    context.feed(ids)
    new = KVPrefix.from_cache(context.cache)
    start = spliced.next_position
    segment = verbatim_segment(new, spliced.physical_length, spliced.physical_length + len(ids))
    segment.span = (start, start + len(ids))
    segment.positions = torch.arange(start, start + len(ids)).float()
    segment.keys, segment.values = segment.keys.float().cpu(), segment.values.float().cpu()
    return segment


def compress_transcript(
    lm: FrozenLM,
    transcript,
    turns: tuple[int, int],
    config: CompressConfig,
    on_step: Callable[[int, float], None] | None = None,
    window: tuple[int, int] | None = None,
) -> SplicedCache:
    """Render, compress messages [turns[0], turns[1]) and record what a cache file needs to be checked later
    (`window`: the original turns a windowed transcript was cut from, so `ask` can rebuild it)."""
    from vkv.kv.file import cache_metadata
    from vkv.text.transcript import render

    rendered = render(transcript, lm.tokenizer)
    limit = getattr(lm.config, "max_position_embeddings", None)
    if limit and len(rendered.ids) > limit:
        raise VkvError(
            f"{transcript.path or transcript.id}: renders to {len(rendered.ids)} tokens, more than the "
            f"{limit} positions of {lm.name}; compress a window of it (--window)"
        )
    start, end = rendered.token_span(*turns)
    spliced = compress(lm, rendered.ids, start, end, config, [s.start for s in rendered.spans], on_step=on_step)
    spliced.meta = cache_metadata(
        lm,
        transcript={
            "id": transcript.id,
            "sha256": transcript.sha256,
            "path": transcript.path,
            "turns": list(turns),
            "tokens": len(rendered.ids),
            "window": list(window) if window else None,
        },
        config=config.to_dict(),
    )
    return spliced
