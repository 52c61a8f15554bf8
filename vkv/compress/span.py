"""Compress one span of a rendered conversation into virtual tokens and splice them into a cache (the Python call
under `vkv compress`'s vkv and under `vkv.compress_span`).

One forward pass over the uncompressed text up to the span's end gives the prefix K/V, the span's per-layer
V (and pre-RoPE K) and per-token surprisal; the recipe's pipeline (compress/recipe.py) makes the span's segment; tokens
after the span (if any) are re-encoded on top of the compressed cache at their original positions, so nothing they
carry was computed with the uncompressed span in view.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from vkv.compress.budget import span_budget
from vkv.compress.config import CompressConfig
from vkv.compress.recipe import VkvRecipe, recipe_segment
from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.kv.file import cache_metadata, transcript_record
from vkv.kv.spliced import SplicedCache
from vkv.lm.frozen import FrozenLM
from vkv.lm.splice import splice
from vkv.text.transcript import render


def compress_span(
    lm: FrozenLM,
    ids: list[int],
    start: int,
    end: int,
    ratio: float,
    config: CompressConfig,
    message_starts: list[int] | None = None,
    attention: torch.Tensor | None = None,
    on_step: Callable[[int, float], None] | None = None,
    message_roles: list[str] | None = None,
) -> SplicedCache:
    """Prefix verbatim, [start, end) virtual at `ratio`, everything after re-encoded on top: a SplicedCache of `ids`
    (`message_starts`, `message_roles`: each message's first token and role, where the recipe reads them)."""
    if not 0 <= start < end <= len(ids):
        raise VkvError(f"span [{start}, {end}) is empty or outside the {len(ids)} rendered tokens")
    budget = span_budget(end - start, ratio)  # a ratio the span cannot take is refused before the prefill
    recipe = VkvRecipe(compress=config).validate()
    work = SpanWork.capture(lm, ids, start, end, message_starts, message_roles, recipe.compress.optim.seed, attention)
    return splice(lm, work.kv, start, end, recipe_segment(work, recipe, budget, on_step), ids[end:])


def render_within_positions(lm: FrozenLM, transcript):
    """The transcript rendered by the model's tokenizer, refused when it is longer than the model's positions."""
    rendered = render(transcript, lm.tokenizer, max_tokens=lm.max_positions)  # too long: refused before message work
    lm.check_positions(len(rendered.ids), f"{transcript.path or transcript.id} ({len(rendered.ids)} tokens)")
    return rendered


def compress_transcript(
    lm: FrozenLM,
    transcript,
    turns: tuple[int, int],
    ratio: float,
    config: CompressConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> SplicedCache:
    """Render, compress messages [turns[0], turns[1]) at `ratio` and record what a cache file needs to be checked later."""
    rendered = render_within_positions(lm, transcript)
    start, end = rendered.token_span(*turns)
    spliced = compress_span(
        lm, rendered.ids, start, end, ratio, config, rendered.message_starts, None, on_step, rendered.message_roles
    )
    spliced.meta = cache_metadata(
        lm, transcript=transcript_record(transcript, turns, len(rendered.ids)), config=config.to_dict(), ratio=ratio
    )
    return spliced
