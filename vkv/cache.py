"""SplicedCache: an ordered list of K/V segments (verbatim or virtual) plus the next logical position.

Physical length (entries in the cache) and logical position (where the next token sits on the RoPE axis)
differ once a span is compressed: a span of 300 tokens may be 94 virtual entries, yet the next token still
sits at the position it had in the uncompressed conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from . import __version__
from .errors import VkvError
from .io import atomic_path
from .model import FrozenLM, KVPrefix

FORMAT_VERSION = 1
KINDS = ("verbatim", "virtual")


@dataclass
class Segment:
    """K/V entries standing for original tokens [span[0], span[1])."""

    kind: str
    span: tuple[int, int]
    keys: torch.Tensor  # [layers, kv_heads, entries, head_dim], post-RoPE, as the model stores them
    values: torch.Tensor  # [layers, kv_heads, entries, head_dim]
    positions: torch.Tensor  # [entries] float32 logical positions
    embeddings: torch.Tensor | None = None  # [entries, hidden] for virtual segments
    stats: dict[str, Any] = field(default_factory=dict)
    mass: torch.Tensor | None = None  # [entries] original tokens each entry stands for; later queries add
    # log(mass) to their attention logits (proportional attention); None: one token each, no bias

    @property
    def entries(self) -> int:
        return self.keys.shape[2]

    @property
    def original_tokens(self) -> int:
        return self.span[1] - self.span[0]

    @property
    def ratio(self) -> float:
        return self.original_tokens / max(self.entries, 1)

    def row(self) -> dict[str, Any]:
        return {"kind": self.kind, "span": list(self.span), "entries": self.entries, "ratio": round(self.ratio, 4),
                **{k: v for k, v in self.stats.items() if not isinstance(v, (list, dict))}}


def verbatim_segment(cache_or_prefix, start: int, end: int) -> Segment:
    """Real K/V of original tokens [start, end) from a transformers cache or KVPrefix holding them."""
    prefix = cache_or_prefix if isinstance(cache_or_prefix, KVPrefix) else KVPrefix.from_cache(cache_or_prefix)
    keys = torch.stack([k[0, :, start:end] for k in prefix.keys])
    values = torch.stack([v[0, :, start:end] for v in prefix.values])
    return Segment("verbatim", (start, end), keys.detach(), values.detach(), torch.arange(start, end).float())


@dataclass
class SplicedCache:
    segments: list[Segment] = field(default_factory=list)
    next_position: int = 0
    meta: dict[str, Any] = field(default_factory=dict)

    def append(self, segment: Segment, next_position: int | None = None) -> None:
        if segment.kind not in KINDS:
            raise VkvError(f"unknown segment kind '{segment.kind}'")
        if self.segments and segment.span[0] < self.segments[-1].span[1]:
            raise VkvError(f"segment {segment.span} overlaps the previous one {self.segments[-1].span}")
        self.segments.append(segment)
        self.next_position = segment.span[1] if next_position is None else next_position

    @property
    def physical_length(self) -> int:
        return sum(s.entries for s in self.segments)

    def kv(self) -> KVPrefix:
        """Per-layer concatenation of all segments, `[1, kv_heads, physical_length, head_dim]` each."""
        layers = self.segments[0].keys.shape[0]
        keys = [torch.cat([s.keys[layer] for s in self.segments], dim=1)[None] for layer in range(layers)]
        values = [torch.cat([s.values[layer] for s in self.segments], dim=1)[None] for layer in range(layers)]
        return KVPrefix(keys, values)

    def attention_bias(self) -> torch.Tensor | None:
        """log(mass) per entry `[physical_length]` (0 for entries without a mass); None when no segment has one."""
        if all(s.mass is None for s in self.segments):
            return None
        return torch.cat([torch.zeros(s.entries) if s.mass is None else s.mass.float().log() for s in self.segments])

    def to_dynamic_cache(self, lm: FrozenLM):
        """A transformers DynamicCache holding the spliced entries, on the model's device and dtype."""
        return self.kv().to_dynamic_cache(lm) if self.segments else lm.new_cache()

    def span_entries(self, start: int, end: int) -> int:
        """Entries standing for original tokens inside [start, end)."""
        return sum(s.entries for s in self.segments if start <= s.span[0] and s.span[1] <= end)

    def table(self) -> list[dict[str, Any]]:
        return [s.row() for s in self.segments]


# ---- safetensors files ------------------------------------------------------------------------


def cache_metadata(lm: FrozenLM, **extra) -> dict[str, Any]:
    return {
        "model": lm.name,
        "fingerprint": lm.fingerprint,
        "quant": lm.quant,
        "dtype": str(lm.dtype).replace("torch.", ""),
        "spec": lm.spec.to_dict(),
        **extra,
    }


def save_cache(cache: SplicedCache, path: str | Path) -> None:
    """Write tensors and a validated metadata header; atomic (temp file, then rename)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for i, seg in enumerate(cache.segments):
        tensors[f"segments.{i}.keys"] = seg.keys.contiguous().cpu()
        tensors[f"segments.{i}.values"] = seg.values.contiguous().cpu()
        tensors[f"segments.{i}.positions"] = seg.positions.float().contiguous().cpu()
        if seg.embeddings is not None:
            tensors[f"segments.{i}.embeddings"] = seg.embeddings.float().contiguous().cpu()
        if seg.mass is not None:
            tensors[f"segments.{i}.mass"] = seg.mass.float().contiguous().cpu()
    header = {
        "format_version": FORMAT_VERSION,
        "vkv_version": __version__,
        "next_position": cache.next_position,
        "segments": [
            {"kind": s.kind, "span": list(s.span), "entries": s.entries, "ratio": s.ratio, "stats": s.stats}
            for s in cache.segments
        ],
        **cache.meta,
    }
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"vkv": json.dumps(header, default=str)})


def read_header(path: str | Path) -> dict[str, Any]:
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise VkvError(f"{p}: no such cache file")
    try:
        with safe_open(str(p), framework="pt") as f:
            raw = (f.metadata() or {}).get("vkv")
    except Exception as exc:  # safetensors raises its own error types for truncated or corrupt headers
        raise VkvError(f"{p}: not a readable safetensors file (truncated or corrupt: {exc})") from exc
    if raw is None:
        raise VkvError(f"{p}: safetensors file without vkv metadata, so not a vkv cache")
    try:
        header = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise VkvError(f"{p}: vkv metadata is not valid JSON") from exc
    if header.get("format_version") != FORMAT_VERSION:
        raise VkvError(f"{p}: cache format version {header.get('format_version')} (this vkv reads {FORMAT_VERSION})")
    return header


def load_cache(path: str | Path, lm: FrozenLM | None = None) -> SplicedCache:
    """Read a cache file; with a model, refuse one built for another model or with inconsistent shapes."""
    from safetensors.torch import load_file

    p = Path(path)
    header = read_header(p)
    if lm is not None and header.get("fingerprint") != lm.fingerprint:
        raise VkvError(
            f"{p}: field fingerprint: cache was built for model '{header.get('model')}' "
            f"({header.get('fingerprint')}), not for '{lm.name}' ({lm.fingerprint})"
        )
    try:
        tensors = load_file(str(p))
    except Exception as exc:
        raise VkvError(f"{p}: tensor data is truncated or corrupt ({exc})") from exc
    spec = header.get("spec", {})
    expected = (spec.get("num_layers"), spec.get("num_kv_heads"), spec.get("head_dim"))
    cache = SplicedCache(meta={k: v for k, v in header.items() if k not in ("segments", "next_position")})
    for i, row in enumerate(header.get("segments", [])):
        cache.segments.append(_segment_from(tensors, i, row, expected, p))
    cache.next_position = int(header["next_position"])
    return cache


def _segment_from(tensors, i: int, row: dict, expected: tuple, path: Path) -> Segment:
    try:
        keys, values, positions = (tensors[f"segments.{i}.{name}"] for name in ("keys", "values", "positions"))
    except KeyError as exc:
        raise VkvError(f"{path}: segment {i} is missing tensor {exc}") from exc
    where = f"{path}: field segments[{i}]"
    if keys.shape != values.shape or tuple(keys.shape[:2]) + (keys.shape[3],) != expected:
        raise VkvError(f"{where}: K/V shape {tuple(keys.shape)} does not match the model's "
                       f"(layers, kv_heads, head_dim) = {expected}")
    if keys.shape[2] != row.get("entries") or positions.shape != (keys.shape[2],):
        raise VkvError(f"{where}: {keys.shape[2]} entries and {positions.numel()} positions, table says "
                       f"{row.get('entries')}")
    if row.get("kind") not in KINDS:
        raise VkvError(f"{where}.kind: unknown segment kind {row.get('kind')!r}")
    mass = tensors.get(f"segments.{i}.mass")
    if mass is not None and (mass.shape != positions.shape or not bool((mass > 0).all())):
        raise VkvError(f"{where}: mass must hold one positive count per entry, got shape {tuple(mass.shape)}")
    return Segment(row["kind"], tuple(row["span"]), keys, values, positions,
                   tensors.get(f"segments.{i}.embeddings"), row.get("stats", {}), mass)
