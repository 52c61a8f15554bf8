"""Compression report: per segment (one per message in multi-turn caches), what was kept and at what loss.

Rows come from a cache file's header alone (no model needed): role, original tokens, entries kept, ratio,
final loss, target drift, and the tokens a hybrid segment kept verbatim as decoded text, so a person can
see that `bcryptjs` survived.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vkv.kv.spliced import SplicedCache


def report_rows(header: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per segment of a cache file header (as `read_header` returns it)."""
    return [segment_row(seg) for seg in header.get("segments", [])]


def cache_rows(cache: SplicedCache) -> list[dict[str, Any]]:
    """The same rows for a cache in memory."""
    return [
        segment_row({"kind": s.kind, "span": list(s.span), **s.entry_counts(), "stats": s.stats})
        for s in cache.segments
    ]


def segment_row(segment: dict[str, Any]) -> dict[str, Any]:
    """`entries`: what attention reaches per layer and KV head (the ratio counts these); `slots`: what the cache
    holds, more when head-wise budgets pad the heads that keep fewer."""
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
    return {
        "tokens": sum(r["tokens"] for r in rows),
        "entries": sum(r["entries"] for r in rows),
        "compressed_tokens": tokens,
        "compressed_entries": entries,
        "compressed_ratio": round(tokens / entries, 3) if entries else None,
    }


def storage(path: str | Path, header: dict[str, Any]) -> dict[str, Any]:
    """How the file stores its segments and what it costs: file bytes per original token the compressed segments
    stand for (the whole file is counted, verbatim segments included)."""
    size = Path(path).stat().st_size
    tokens = report_totals(report_rows(header))["compressed_tokens"]
    return {
        "store": header.get("store", "kv"),
        "file_bytes": size,
        "bytes_per_original_token": round(size / tokens) if tokens else None,
    }


def report_table(rows: list[dict[str, Any]], title: str = "compression report"):
    """A rich Table of the rows (verbatim text shortened for the terminal)."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("turn", "role", "kind", "tokens", "entries", "ratio", "loss", "drift", "verbatim kept"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            _text(r["turn"]),
            _text(r["role"]),
            r["kind"],
            str(r["tokens"]),
            entries_text(r),
            f"{r['ratio']:.2f}",
            _number(r["loss"]),
            _number(r["drift"]),
            _shorten(" | ".join(t.strip() for t in r["verbatim_text"])),
        )
    return table


def entries_text(row: dict[str, Any]) -> str:
    """A row's entries for a table: "149", or "149 of 298 slots" when heads reach fewer than the cache holds."""
    return f"{row['entries']:g}" if row["entries"] == row["slots"] else f"{row['entries']:g} of {row['slots']} slots"


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
