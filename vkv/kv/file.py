"""Cache files: a SplicedCache as safetensors tensors plus a validated JSON header (no pickle)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vkv import __version__
from vkv.errors import VkvError
from vkv.io import atomic_path
from vkv.kv.segment import KINDS, Segment, mass_bias
from vkv.kv.spliced import SplicedCache

if TYPE_CHECKING:
    from vkv.lm.frozen import FrozenLM

FORMAT_VERSION = 2  # 2: per-layer, per-KV-head `bias` tensors; 1 (still read): a shared `mass` per entry
READABLE_VERSIONS = (1, 2)


def transcript_record(transcript, turns: tuple[int, int], tokens: int) -> dict[str, Any]:
    """What a cache file records of the transcript it was built from, so `vkv ask` can check and rebuild it:
    the file's id, hash and path, the compressed turns, the rendered length, and for a window of the file's
    transcript the messages [first, last) it was cut from."""
    window = getattr(transcript, "window", None)
    return {
        "id": transcript.id,
        "sha256": transcript.sha256,
        "path": transcript.path,
        "turns": list(turns),
        "tokens": tokens,
        "window": list(window) if window else None,
    }


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
        if seg.bias is not None:
            tensors[f"segments.{i}.bias"] = seg.bias.float().contiguous().cpu()
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
    if header.get("format_version") not in READABLE_VERSIONS:
        raise VkvError(
            f"{p}: field format_version: cache format version {header.get('format_version')} "
            f"(this vkv reads {', '.join(map(str, READABLE_VERSIONS))})"
        )
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
        raise VkvError(
            f"{where}: K/V shape {tuple(keys.shape)} does not match the model's "
            f"(layers, kv_heads, head_dim) = {expected}"
        )
    if keys.shape[2] != row.get("entries") or positions.shape != (keys.shape[2],):
        raise VkvError(
            f"{where}: {keys.shape[2]} entries and {positions.numel()} positions, table says {row.get('entries')}"
        )
    if row.get("kind") not in KINDS:
        raise VkvError(f"{where}.kind: unknown segment kind {row.get('kind')!r}")
    bias = tensors.get(f"segments.{i}.bias")
    mass = tensors.get(f"segments.{i}.mass")  # version 1: proportional attention's token counts
    if mass is not None:
        if mass.shape != positions.shape or not bool((mass > 0).all()):
            raise VkvError(f"{where}: mass must hold one positive count per entry, got shape {tuple(mass.shape)}")
        bias = mass_bias(mass, *keys.shape[:2])
    if bias is not None and (bias.shape != keys.shape[:3] or not bool(torch.isfinite(bias).all())):
        raise VkvError(
            f"{where}.bias: expected finite values of shape (layers, kv_heads, entries) = {tuple(keys.shape[:3])}, "
            f"got {tuple(bias.shape)}"
        )
    return Segment(
        row["kind"],
        tuple(row["span"]),
        keys,
        values,
        positions,
        tensors.get(f"segments.{i}.embeddings"),
        row.get("stats", {}),
        bias,
    )
