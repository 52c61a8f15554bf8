"""Loading cache files with a model: a `kv` file is checked against it; an embeddings-only file has its K/V
recomputed, segment by segment, each on top of those before it (what `vkv.kv.stored` keeps makes that exact).
"""

from __future__ import annotations

from pathlib import Path

import torch

from vkv.errors import VkvError
from vkv.kv.file import read_cache
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment
from vkv.kv.spliced import SplicedCache
from vkv.kv.stored import StoredCache
from vkv.lm.frozen import FrozenLM
from vkv.lm.plausible import check_plausible
from vkv.lm.splice import reencode


def load_cache(path: str | Path, lm: FrozenLM | None = None, trust_foreign: bool = False) -> SplicedCache:
    """Read a cache file; refuse one not signed with this user's key unless `trust_foreign` (vkv.kv.sign); with a
    model, refuse one built for another model or whose entries (read or rebuilt) that model could not have produced
    (`vkv.lm.plausible`). An embeddings-only file needs the model: its K/V are rebuilt by forward passes."""
    cache = read_cache(path, None if lm is None else lm.fingerprint, trust_foreign)
    if isinstance(cache, StoredCache):
        if lm is None:
            raise VkvError(
                f"{path}: field store: an embeddings-only cache holds no keys or values; a model is needed to "
                "rebuild them"
            )
        cache = rebuild(lm, cache)
    if lm is not None:
        check_plausible(lm, cache, path)
    return cache


def virtual_kv(
    lm: FrozenLM, embeddings: torch.Tensor, positions: torch.Tensor, prefix: KVPrefix
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values `[layers, kv_heads, k, head_dim]` (float32, CPU) of virtual embeddings `[k, hidden]` at
    `positions` `[k]` on top of `prefix`: the pass that gives a virtual segment its K/V after optimisation."""
    with torch.no_grad():
        keys, values = lm.forward_kv(embeddings[None].to(lm.device), positions, prefix)
    return torch.cat(keys).float().cpu(), torch.cat(values).float().cpu()


def rebuild(lm: FrozenLM, stored: StoredCache) -> SplicedCache:
    """The SplicedCache of an embeddings-only file: segments recomputed in order, each on top of those before."""
    cache = SplicedCache(meta=stored.meta)
    for s in stored.segments:
        if s.kind == "verbatim":
            cache.next_position = s.span[0]  # reencode feeds at the cache's next position
            segment = reencode(lm, cache, s.ids)
        else:
            # the compressor's prefix is on the model's device in its dtype (single span) or float32 segments
            # (sequential), which forward_kv casts to that dtype: the same numbers either way
            keys, values = virtual_kv(lm, s.embeddings, s.positions, lm.prefix(cache))
            segment = Segment(s.kind, s.span, keys, values, s.positions, s.embeddings)
        segment.stats, segment.bias, segment.separable = s.stats, s.bias, s.separable
        cache.append(segment)
    cache.next_position = stored.next_position
    return cache
