"""Compression report: per segment (one per message in multi-turn caches), what was kept and at what loss.

Rows come from a cache file's header alone (no model needed): role, original tokens, entries kept, ratio,
final loss, target drift, and the tokens a hybrid segment kept verbatim as decoded text, so a person can
see that `bcryptjs` survived.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from rich.table import Table

from vkv.kv.file import read_cache
from vkv.kv.ragged import kv_row_bytes, memory_plan, offsets_nbytes
from vkv.kv.segment import most_entries_per_head
from vkv.kv.spliced import SplicedCache


def report_rows(header: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per segment of a cache file header (as `read_header` returns it), with the bytes each takes in the
    decoding cache of the model and dtype the header names."""
    spec = header.get("spec") or {}
    shape = (spec.get("num_layers"), spec.get("num_kv_heads"), spec.get("head_dim"))
    dtype = getattr(torch, str(header.get("dtype", "float32")), torch.float32)
    return with_memory(
        [segment_row(seg) for seg in header.get("segments", [])], header.get("segments", []), shape, dtype
    )


def cache_rows(cache: SplicedCache, dtype: torch.dtype = torch.float32) -> list[dict[str, Any]]:
    """The same rows for a cache in memory (bytes for a decoding cache in `dtype`)."""
    counts = [{"kind": s.kind, "span": list(s.span), **s.entry_counts(), "stats": s.stats} for s in cache.segments]
    shape = tuple(cache.segments[0].keys.shape[i] for i in (0, 1, 3)) if cache.segments else (0, 0, 0)
    return with_memory([segment_row(c) for c in counts], counts, shape, dtype)


def with_memory(
    rows: list[dict[str, Any]], counts: list[dict[str, Any]], shape: tuple, dtype: torch.dtype
) -> list[dict[str, Any]]:
    """`rows` with `memory_bytes` (and `memory_part`, dense or flat) from the header's counts: what
    `RaggedCache.from_segments` holds for each segment. Headers written before the decoding cache was ragged lack
    `reached` and `biased`; for them `reached` is the rounded entries per KV head times layers × heads, and a
    segment is taken to carry a bias when it is padded or virtual."""
    if None in shape or not rows:
        return rows
    layers, heads, _ = shape
    parts = memory_plan(
        [
            (
                layers * heads * c["entries"],
                c.get("reached", round(c["real_entries"] * layers * heads) if "real_entries" in c else None),
                c.get("biased", "real_entries" in c or c["kind"] == "virtual"),
            )
            for c in counts
        ],
        shape,
        torch.empty(0, dtype=dtype).element_size(),
    ).parts
    full_row = kv_row_bytes(shape, torch.empty(0, dtype=dtype).element_size()) * layers * heads
    return [
        {**r, "memory_part": part, "memory_bytes": nbytes, "full_bytes": r["tokens"] * full_row, "shape": list(shape)}
        for r, (part, _, nbytes) in zip(rows, parts)
    ]


def segment_row(segment: dict[str, Any]) -> dict[str, Any]:
    """`entries`: entries per KV head (the ratio counts these; the header's `real_entries`); `slots`: slots per
    layer and KV head, what a padded cache holds (the header's `entries`), more when head-wise budgets pad."""
    stats = segment.get("stats") or {}
    start, end = segment["span"]
    slots = segment["entries"]
    entries = segment.get("real_entries", slots)
    verbatim_text = list(stats.get("verbatim_text", []))
    hybrid = segment["kind"] == "virtual" and "verbatim_entries" in stats
    return {
        "turn": stats.get("turn"),
        "role": stats.get("role"),
        "kind": "hybrid" if hybrid else segment["kind"],
        "span": [start, end],
        "tokens": end - start,
        "entries": entries,
        "slots": slots,
        "ratio": round((end - start) / max(entries, 1), 3),
        "loss": _loss(stats),
        "drift": stats.get("drift"),
        "targets": stats.get("targets"),
        "auto_ratio": (stats.get("auto_ratio") or {}).get("chosen"),
        "verbatim_kept": len(verbatim_text),
        "verbatim_text": verbatim_text,
    }


def report_totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Whole-cache and compressed-part token and entry counts (a turn auto-ratio kept verbatim counts as
    compressed: it was a candidate)."""
    squeezed = [r for r in rows if r["kind"] != "verbatim" or r["auto_ratio"] is not None]
    tokens, entries = sum(r["tokens"] for r in squeezed), sum(r["entries"] for r in squeezed)
    totals = {
        "tokens": sum(r["tokens"] for r in rows),
        "entries": sum(r["entries"] for r in rows),
        "compressed_tokens": tokens,
        "compressed_entries": entries,
        "compressed_ratio": round(tokens / entries, 3) if entries else None,
    }
    if rows and "memory_bytes" in rows[0]:
        offsets = offsets_nbytes(tuple(rows[0]["shape"])) if any(r["memory_part"] == "flat" for r in rows) else 0
        held = sum(r["memory_bytes"] for r in squeezed) + offsets
        full = sum(r["full_bytes"] for r in squeezed)
        totals.update(
            memory_bytes=sum(r["memory_bytes"] for r in rows) + offsets,
            compressed_memory_bytes=held,
            compressed_full_bytes=full,
            ratio_memory=round(full / held, 3) if held else None,
        )
    return totals


def storage(path: str | Path, header: dict[str, Any]) -> dict[str, Any]:
    """How the file stores its segments and what it costs: file bytes per original token the compressed segments
    stand for (the whole file is counted, verbatim segments included); and in memory, once loaded for decoding in
    the dtype the header names: the whole cache's bytes, the compressed segments' (with the per-head offsets), and
    `ratio_memory`, their full K/V bytes over the latter."""
    size = Path(path).stat().st_size
    totals = report_totals(report_rows(header))
    tokens = totals["compressed_tokens"]
    return {
        "store": header.get("store", "kv"),
        "file_bytes": size,
        "bytes_per_original_token": round(size / tokens) if tokens else None,
        **{k: totals[k] for k in ("memory_bytes", "compressed_memory_bytes", "ratio_memory") if k in totals},
    }


def entries_per_head(path: str | Path, header: dict[str, Any], trust_foreign: bool = False) -> dict[str, float]:
    """The compressed segments' entries per KV head on average (`compressed_entries_per_head`: what a ratio and a
    running cache's cap count), and the most entries any layer's KV head holds in the whole file and in its compressed
    segments (`max_entries_per_head`, `compressed_max_entries_per_head`: what a padded layout needs), counted from the
    stored masks (a file of embeddings holds every slot in every head)."""
    if header.get("store", "kv") == "kv":
        segments = read_cache(path, trust_foreign=trust_foreign).segments
        compressed = [s for s in segments if s.compressed]
        mean = sum(s.real_entries for s in compressed)
        whole, most = most_entries_per_head(segments), most_entries_per_head(compressed)
    else:
        rows = header.get("segments", [])
        squeezed = [r for r in rows if r["kind"] != "verbatim" or r["entries"] < r["span"][1] - r["span"][0]]
        whole, most = sum(r["entries"] for r in rows), sum(r["entries"] for r in squeezed)
        mean = most
    return {
        "compressed_entries_per_head": round(mean, 2),
        "max_entries_per_head": whole,
        "compressed_max_entries_per_head": most,
    }


def report_table(rows: list[dict[str, Any]], title: str = "compression report"):
    """A rich Table of the rows (verbatim text shortened for the terminal)."""
    table = Table(title=title)
    for column in ("turn", "role", "kind", "tokens", "entries", "ratio", "in memory", "loss", "drift", "verbatim kept"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            _text(r["turn"]),
            _text(r["role"]),
            r["kind"],
            str(r["tokens"]),
            entries_text(r),
            f"{r['ratio']:.2f}",
            memory_text(r),
            _number(r["loss"]),
            _number(r["drift"]),
            _shorten(" | ".join(t.strip() for t in r["verbatim_text"])),
        )
    return table


def entries_text(row: dict[str, Any]) -> str:
    """A row's entries for a table: "149", or "149 of 298 slots" when some slots are padding."""
    return f"{row['entries']:g}" if row["entries"] == row["slots"] else f"{row['entries']:g} of {row['slots']} slots"


def memory_text(row: dict[str, Any]) -> str:
    """A row's bytes in the decoding cache and the ratio they give: "36.2 KiB (4.10×)"."""
    if "memory_bytes" not in row:
        return "—"
    ratio = f" ({row['full_bytes'] / row['memory_bytes']:.2f}×)" if row["memory_bytes"] else ""
    return f"{row['memory_bytes'] / 1024:.1f} KiB{ratio}"


def _loss(stats: dict[str, Any]) -> float | None:
    if stats.get("loss") is not None:
        return float(stats["loss"])
    per_layer = stats.get("per_layer_loss")
    return round(sum(per_layer) / len(per_layer), 6) if per_layer else None


def _text(value: Any) -> str:
    return "—" if value is None else str(value)


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def _shorten(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
