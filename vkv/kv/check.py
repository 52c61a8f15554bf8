"""A cache file checked in full before any entry is used: its header's segment table and its tensors' names, dtypes
and shapes against each other and against the model shape the header records. Anything else is refused with one
sentence naming the file and the field, so a corrupted or edited file is never answered from.

`read_cache` (every loader) and `vkv inspect` call `check_cache`; what it cannot see from the file alone (whether the
entries suit the model in hand) the loaders check against the model's fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from vkv.errors import VkvError
from vkv.kv.segment import KINDS

STORES = ("kv", "embeddings")  # the header's `store` (absent: kv); embeddings: no K/V, rebuilt at load
NAME = re.compile(r"segments\.(\d+)\.([a-z_]+)")
FLOATS = (torch.float32,)  # vkv writes every float tensor in float32, whatever the model's dtype
TENSORS = {  # per store: each tensor name a segment may have, with its dtypes
    "kv": {
        "keys": FLOATS,
        "values": FLOATS,
        "positions": FLOATS,
        "embeddings": FLOATS,
        "bias": FLOATS,
        "mass": FLOATS,
        "bias_per_entry": FLOATS,
        "bias_per_head": FLOATS,
        "bias_mask": (torch.uint8,),
        "real": (torch.bool,),
        "keys_real": FLOATS,
        "values_real": FLOATS,
        "bias_real": FLOATS,
    },
    "embeddings": {
        "ids": (torch.int32, torch.int64),
        "positions": FLOATS,
        "embeddings": FLOATS,
        "bias": FLOATS,
        "bias_per_entry": FLOATS,
        "bias_per_head": FLOATS,
        "bias_mask": (torch.uint8,),
    },
}


def digest(header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> str:
    """sha256 of what decoding reads: every tensor (name, dtype, shape, bytes) and the header's model shape, store,
    next position and segment table (kind, span, entries). A file records it at save, so that a tensor or a table
    entry changed afterwards is refused instead of answered from (statistics, config and labels are not covered)."""
    table = {
        "format_version": header.get("format_version"),
        "store": header.get("store", "kv"),
        "next_position": header.get("next_position"),
        "spec": header.get("spec"),
        "segments": [[r.get("kind"), r.get("span"), r.get("entries")] for r in header.get("segments") or []],
    }
    h = hashlib.sha256(json.dumps(table, sort_keys=True, default=str).encode())
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{list(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def check_digest(path: str | Path, header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Refuse a file whose tensors or segment table no longer match the digest it recorded (files written before
    the digest have none)."""
    if "digest" in header and header["digest"] != digest(header, tensors):
        raise VkvError(
            f"{path}: field digest: the file's tensors or segment table changed after it was written (sha256 mismatch)"
        )


def check_cache(path: str | Path, header: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Refuse a cache file whose header and tensors do not describe one valid cache (the digest is checked last,
    `check_digest`, so that a damaged field is named when it can be)."""
    where = f"{path}: field"
    store = header.get("store", "kv")
    if store not in STORES:
        raise VkvError(f"{where} store: unknown store {store!r} (this vkv reads {', '.join(STORES)})")
    shape = _spec(header, where)
    rows = _segments(header, where)
    for name, tensor in tensors.items():
        _check_name(name, tensor, len(rows), store, where)
    for i, row in enumerate(rows):
        _check_segment(i, row, tensors, shape, store, f"{where} segments[{i}]")


def _spec(header: dict[str, Any], where: str) -> tuple[int, int, int, int]:
    spec = header.get("spec")
    keys = ("num_layers", "num_kv_heads", "head_dim", "hidden_size")
    if not isinstance(spec, dict) or not all(_count(spec.get(k), 1) for k in keys):
        raise VkvError(f"{where} spec: the model shape ({', '.join(keys)}) must be positive integers, got {spec!r}")
    return tuple(spec[k] for k in keys)


def _segments(header: dict[str, Any], where: str) -> list[dict[str, Any]]:
    rows = header.get("segments")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise VkvError(f"{where} segments: expected a list of segment records, got {type(rows).__name__}")
    end = 0
    for i, row in enumerate(rows):
        span = row.get("span")
        if row.get("kind") not in KINDS:
            raise VkvError(f"{where} segments[{i}].kind: unknown segment kind {row.get('kind')!r}")
        if not (isinstance(span, list) and len(span) == 2 and all(_count(x, 0) for x in span) and span[0] < span[1]):
            raise VkvError(f"{where} segments[{i}].span: expected [start, end) token positions, got {span!r}")
        if span[0] < end:
            raise VkvError(f"{where} segments[{i}].span: {span} overlaps the previous segment, which ends at {end}")
        if not _count(row.get("entries"), 0):
            raise VkvError(f"{where} segments[{i}].entries: expected a count of entries, got {row.get('entries')!r}")
        end = span[1]
    position = header.get("next_position")
    if not _count(position, end):
        raise VkvError(
            f"{where} next_position: expected an integer position at or after the last segment's end {end}, "
            f"got {position!r}"
        )
    return rows


def _check_name(name: str, tensor: torch.Tensor, segments: int, store: str, where: str) -> None:
    match = NAME.fullmatch(name)
    if match is None or int(match.group(1)) >= segments or match.group(2) not in TENSORS[store]:
        raise VkvError(f"{where} {name}: not a tensor of a {store} cache with {segments} segment(s)")
    allowed = TENSORS[store][match.group(2)]
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise VkvError(f"{where} {name}: dtype {str(tensor.dtype).replace('torch.', '')}, expected {names}")


def _check_segment(i: int, row: dict, tensors: dict, shape: tuple, store: str, where: str) -> None:
    layers, heads, dim, hidden = shape
    entries, (start, end) = row["entries"], row["span"]
    has = {name.split(".", 2)[2]: t for name, t in tensors.items() if name.startswith(f"segments.{i}.")}
    positions = has.get("positions")
    if positions is None or tuple(positions.shape) != (entries,):
        found = None if positions is None else tuple(positions.shape)
        raise VkvError(f"{where}.positions: expected {entries} positions (the table's entries), got {found}")
    # a compact segment's slot positions average its heads' own entries, so only they need not be in order
    ordered = row["kind"] != "compact"
    if entries and (
        not bool(torch.isfinite(positions).all())
        or (ordered and bool((positions.diff() < 0).any()))
        or float(positions.min()) < start
        or float(positions.max()) > end
    ):
        order = "in order and " if ordered else ""
        raise VkvError(f"{where}.positions: must be finite, {order}inside the segment's span [{start}, {end})")
    if "embeddings" in has and tuple(has["embeddings"].shape) != (entries, hidden):
        raise VkvError(
            f"{where}.embeddings: expected [entries, hidden] = {[entries, hidden]}, got {list(has['embeddings'].shape)}"
        )
    if store == "embeddings":
        return  # ids, embeddings and biases are checked as the file is read (vkv.kv.file)
    if "real" in has:
        _check_flat(has, (layers, heads, entries), dim, where)
    elif any(name in has for name in ("keys_real", "values_real", "bias_real")):
        raise VkvError(f"{where}.real: flat keys, values or biases without the mask of the slots they fill")
    else:
        for name in ("keys", "values"):
            t = has.get(name)
            if t is None or tuple(t.shape) != (layers, heads, entries, dim):
                found = None if t is None else list(t.shape)
                raise VkvError(
                    f"{where}.{name}: expected [layers, kv_heads, entries, head_dim] = {[layers, heads, entries, dim]}, "
                    f"got {found}"
                )
            if not bool(torch.isfinite(t).all()):
                raise VkvError(f"{where}.{name}: holds values that are not finite")


def _check_flat(has: dict, slots: tuple[int, int, int], dim: int, where: str) -> None:
    real = has["real"]
    if tuple(real.shape) != slots:
        raise VkvError(f"{where}.real: expected [layers, kv_heads, entries] = {list(slots)}, got {list(real.shape)}")
    count = int(real.sum())
    for name, expected in (("keys_real", (count, dim)), ("values_real", (count, dim)), ("bias_real", (count,))):
        t = has.get(name)
        if t is None or tuple(t.shape) != expected:
            raise VkvError(
                f"{where}.{name}: expected {list(expected)} for the {count} slots `real` marks, "
                f"got {None if t is None else list(t.shape)}"
            )
        if not bool(torch.isfinite(t).all()):
            raise VkvError(f"{where}.{name}: holds values that are not finite")
    if any(name in has for name in ("keys", "values", "bias")):
        raise VkvError(f"{where}.real: a segment stored flat cannot also hold padded keys, values or bias")


def _count(value: Any, minimum: int) -> bool:
    """An integer (not a bool, not a float) at least `minimum`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum and not math.isinf(value)
