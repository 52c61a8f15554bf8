"""Cache files: a SplicedCache as safetensors tensors plus a validated JSON header (no pickle)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vkv.errors import VkvError
from vkv.io import atomic_path
from vkv.kv.check import STORES, check_cache, check_digest, digest
from vkv.kv.segment import KINDS, Segment, SeparableBias, mass_bias
from vkv.kv.sign import TRUST_HOW, sign, unsigned_reason
from vkv.kv.spliced import SplicedCache
from vkv.kv.stored import StoredCache, StoredSegment, check_rebuildable
from vkv.version import __version__

# 6: signed with the writer's key (`key_id`, `signature`, vkv.kv.sign); 5: the digest is required; 4: a separable
# bias as per-entry and per-head numbers and a bit mask (the digest from late in its life); 3: padded segments stored
# flat; 2: per-layer, per-KV-head `bias`; 1: a shared `mass` per entry. Files before 6 load only when trusted.
FORMAT_VERSION = 6
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)
COUNTED_SINCE = 5  # from this version on, a segment row without `reached` lets attention reach every slot
SIGNED_SINCE = 6
MAX_NESTING = 64  # a header nests a few levels (config, segment stats); deeper JSON was not written by vkv


@dataclass(frozen=True)
class Versions:
    """The format versions a field belongs to: written from `first` on, required from `required` on (None: never),
    last written by `last` (None: still written). A file whose version is outside a field it holds was edited (its
    version lowered to pass as an older file); one of the current version without a required field had it removed."""

    first: int
    required: int | None = None
    last: int | None = None


HEADER_FIELDS = {
    "digest": Versions(4, required=5),
    "key_id": Versions(SIGNED_SINCE, required=SIGNED_SINCE),
    "signature": Versions(SIGNED_SINCE, required=SIGNED_SINCE),
}
TENSOR_FIELDS = {  # by the name after `segments.{i}.`; those absent from this table are in every version
    "mass": Versions(1, last=1),
    "bias": Versions(2),
    "ids": Versions(2),  # the embeddings store
    **dict.fromkeys(("real", "keys_real", "values_real", "bias_real"), Versions(3)),
    **dict.fromkeys(("bias_per_entry", "bias_per_head", "bias_mask"), Versions(4)),
}


def transcript_record(transcript, turns: tuple[int, int], tokens: int) -> dict[str, Any]:
    """What a cache file records of the transcript it was built from, so `vkv ask` can check and rebuild it:
    the file's id, hash and path, the compressed turns, the rendered length, and for a window of the file's
    transcript the messages [first, last) it was cut from."""
    window = getattr(transcript, "window", None)
    return {
        "id": transcript.id,
        "sha256": transcript.sha256,
        "path": str(Path(transcript.path).resolve()) if transcript.path else None,
        "turns": list(turns),
        "tokens": tokens,
        "window": list(window) if window else None,
    }


class ModelIdentity(Protocol):
    """What a cache file records of the model it was built with (a FrozenLM has all of it)."""

    name: str
    fingerprint: str
    quant: str
    dtype: torch.dtype
    spec: Any  # has to_dict()


def cache_metadata(lm: ModelIdentity, **extra) -> dict[str, Any]:
    return {
        "model": lm.name,
        "fingerprint": lm.fingerprint,
        "quant": lm.quant,
        "dtype": str(lm.dtype).replace("torch.", ""),
        "spec": lm.spec.to_dict(),
        **extra,
    }


def save_cache(
    cache: SplicedCache, path: str | Path, store: str = "kv", ids: Sequence[int] | None = None, force: bool = False
) -> None:
    """Write tensors and a validated metadata header, signed with this user's key (vkv.kv.sign, which makes the key
    on the first write); atomic (temp file, then rename), to a path `vkv.io.check_output` allows: never through a
    link, never over a file of another kind unless `force`.

    `store="embeddings"` writes no keys or values: verbatim segments keep their token ids (taken from `ids`, the
    rendered tokens their spans index) and virtual ones their embeddings; `load_cache` rebuilds the K/V."""
    if store not in STORES:
        raise VkvError(f"{path}: field store: unknown store {store!r}; choose one of {', '.join(STORES)}")
    if store == "embeddings":
        check_rebuildable(cache.segments, ids, path)
    tensors: dict[str, torch.Tensor] = {}
    for i, seg in enumerate(cache.segments):
        flat = store == "kv" and seg.real_entries != seg.slots and _every_head_reaches(torch.isfinite(seg.bias))
        if flat:
            tensors.update(_flat(seg, i))
        elif store == "kv":
            tensors[f"segments.{i}.keys"] = seg.keys.contiguous().cpu()
            tensors[f"segments.{i}.values"] = seg.values.contiguous().cpu()
        elif seg.kind == "verbatim":
            tensors[f"segments.{i}.ids"] = torch.as_tensor(ids[seg.span[0] : seg.span[1]], dtype=torch.int32)
        tensors[f"segments.{i}.positions"] = seg.positions.float().contiguous().cpu()
        if seg.embeddings is not None:
            tensors[f"segments.{i}.embeddings"] = seg.embeddings.float().contiguous().cpu()
        if seg.bias is not None and not flat:
            tensors.update(_bias_tensors(seg, i))
    header = {
        "format_version": FORMAT_VERSION,
        "vkv_version": __version__,
        "next_position": cache.next_position,
        "segments": [
            {"kind": s.kind, "span": list(s.span), **s.entry_counts(), "ratio": s.ratio, "stats": s.stats}
            for s in cache.segments
        ],
        **cache.meta,
        "store": store,  # after the meta, which holds the store a loaded cache came from
    }
    for name in HEADER_FIELDS:  # a loaded cache's meta may hold its file's
        header.pop(name, None)
    header["digest"] = digest(header, tensors)
    header = sign(json.loads(json.dumps(header, default=str)))  # signed as the file will hold it
    with atomic_path(path, "cache", force=force) as tmp:
        save_file(tensors, str(tmp), metadata={"vkv": json.dumps(header)})


def _bias_tensors(seg: Segment, i: int) -> dict[str, torch.Tensor]:
    """Segment i's bias: as `bias_per_entry` `[entries]`, `bias_per_head` `[layers, kv_heads]` and `bias_mask` (the
    reachable slots, `[layers, kv_heads, entries]` packed 8 to a byte) when the segment carries it in that form and the
    form gives back its floats exactly (head-wise virtual tokens: a float per layer, KV head and slot becomes one per
    slot and one bit per layer, KV head and slot); else dense `bias` `[layers, kv_heads, entries]`."""
    s, bias = seg.separable, seg.bias.float().cpu()
    if s is None or s.real.shape != bias.shape or not torch.equal(s.dense().cpu(), bias):
        return {f"segments.{i}.bias": bias.contiguous()}
    return {
        f"segments.{i}.bias_per_entry": s.per_entry.float().contiguous().cpu(),
        f"segments.{i}.bias_per_head": s.per_head.float().contiguous().cpu(),
        f"segments.{i}.bias_mask": _pack_bits(s.real.cpu()),
    }


def _pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """A bool tensor as uint8 `[ceil(numel / 8)]`, 8 elements per byte in row-major order, first in the high bit."""
    bits = torch.cat([mask.flatten(), mask.new_zeros(-mask.numel() % 8)]).view(-1, 8).to(torch.uint8)
    return (bits << torch.arange(7, -1, -1, dtype=torch.uint8)).sum(-1, dtype=torch.uint8)


def _unpack_bits(packed: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of `_pack_bits`: bool `shape`."""
    bits = (packed.to(torch.uint8)[:, None] >> torch.arange(7, -1, -1, dtype=torch.uint8)) & 1
    return bits.flatten()[: torch.Size(shape).numel()].view(shape).bool()


def _every_head_reaches(real: torch.Tensor) -> bool:
    """Whether every head of `real` `[layers, kv_heads, entries]` (bool: reachable slots) has at least one entry, whose
    copy `_unflat` puts in the head's padding slots."""
    return bool(real.any(-1).all())


def _flat(seg: Segment, i: int) -> dict[str, torch.Tensor]:
    """A padded segment (head-wise budgets: −inf-bias slots) as each head's entries only, no padding, so that the
    file's bytes follow the ratio: `real` `[layers, kv_heads, slots]` bool, `keys_real`/`values_real` `[real, head_dim]`
    and `bias_real` `[real]` in (layer, head, slot) order, for any layout of the padding (compact segments keep it
    last, head-wise virtual tokens between their entries). Loading pads again with copies of each head's first real
    entry, which attention never reaches (−inf bias)."""
    real = torch.isfinite(seg.bias).cpu()
    return {
        f"segments.{i}.real": real,
        f"segments.{i}.keys_real": seg.keys.cpu()[real].contiguous(),
        f"segments.{i}.values_real": seg.values.cpu()[real].contiguous(),
        f"segments.{i}.bias_real": seg.bias.float().cpu()[real].contiguous(),
    }


def _unflat(tensors: dict[str, torch.Tensor], i: int, where: str) -> None:
    """Inverse of `_flat`, in place: `segments.{i}.keys`, `values` and `bias` padded to `real`'s shape."""
    real = tensors.pop(f"segments.{i}.real").bool()
    flat = {name: tensors.pop(f"segments.{i}.{name}_real", None) for name in ("keys", "values", "bias")}
    if (
        real.dim() != 3
        or not _every_head_reaches(real)
        or any(t is None or t.shape[0] != int(real.sum()) for t in flat.values())
    ):
        raise VkvError(f"{where}.real: a padded segment's real-entry mask and flat tensors do not agree")
    for name in ("keys", "values"):
        padded = flat[name].new_empty(*real.shape, flat[name].shape[-1])
        padded[real] = flat[name]
        first = real.int().argmax(-1)[..., None, None].expand(-1, -1, 1, padded.shape[-1])  # each head's first real
        tensors[f"segments.{i}.{name}"] = torch.where(real[..., None], padded, padded.gather(2, first))
    bias = torch.full(real.shape, float("-inf"))
    bias[real] = flat["bias"]
    tensors[f"segments.{i}.bias"] = bias


def read_header(path: str | Path) -> dict[str, Any]:
    """A cache file's header, checked for what can be checked without its tensors: a regular file (a device, FIFO or
    directory is never read), JSON of bounded nesting, a readable format version holding only the fields of that
    version (`HEADER_FIELDS`, `TENSOR_FIELDS`), and a transcript record that can name a window."""
    p = Path(path)
    if not p.exists():
        raise VkvError(f"{p}: no such cache file")
    if not p.is_file():
        raise VkvError(f"{p}: no such cache file (this is a directory, device or FIFO, not a regular file)")
    try:
        with safe_open(str(p), framework="pt") as f:
            raw = (f.metadata() or {}).get("vkv")
            names = list(f.keys())
    except Exception as exc:  # safetensors raises its own error types for truncated or corrupt headers
        with open(p, "rb") as handle:
            start = handle.read(64).lstrip()
        if start[:1] in (b"{", b"["):  # a safetensors file opens with its header's length, never with JSON text
            raise VkvError(
                f"{p}: is a JSON file (a transcript or a table?), not a vkv cache (a safetensors file)"
            ) from None
        raise VkvError(f"{p}: not a readable safetensors file (truncated or corrupt: {exc})") from exc
    if raw is None:
        raise VkvError(f"{p}: safetensors file without vkv metadata, so not a vkv cache")
    depth = _nesting(raw)
    if depth > MAX_NESTING:
        raise VkvError(f"{p}: vkv metadata nests {depth} levels deep, more than the {MAX_NESTING} a cache header has")
    try:
        header = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise VkvError(f"{p}: vkv metadata is not valid JSON") from exc
    if not isinstance(header, dict):
        raise VkvError(f"{p}: vkv metadata is a JSON {type(header).__name__}, not an object of header fields")
    if header.get("format_version") not in READABLE_VERSIONS:
        raise VkvError(
            f"{p}: field format_version: cache format version {header.get('format_version')} "
            f"(this vkv reads {', '.join(map(str, READABLE_VERSIONS))})"
        )
    _check_versions(p, header, names)
    _check_transcript(p, header.get("transcript"))
    return header


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')


def _nesting(raw: str) -> int:
    """How deep the JSON text `raw` nests arrays and objects (brackets inside strings do not count), found without
    parsing it, so that hostile nesting never reaches the recursive parser."""
    brackets = np.frombuffer(_STRINGS.sub("", raw).encode(), dtype=np.uint8)
    steps = np.isin(brackets, (ord("["), ord("{"))).astype(np.int64) - np.isin(brackets, (ord("]"), ord("}")))
    return int(steps.cumsum().max()) if steps.size else 0


def _check_versions(path: Path, header: dict, tensor_names: Sequence[str]) -> None:
    """Refuse a header whose format version does not hold the fields it holds (`Versions`)."""
    version = header["format_version"]
    fields = [(name, HEADER_FIELDS[name], name in header) for name in HEADER_FIELDS]
    fields += [
        (t, TENSOR_FIELDS[t.split(".", 2)[-1]], True) for t in tensor_names if t.split(".", 2)[-1] in TENSOR_FIELDS
    ]
    for name, versions, present in fields:
        if not present and versions.required is not None and version >= versions.required:
            raise VkvError(
                f"{path}: field {name}: missing, and every cache of format version {version} holds it (it was removed)"
            )
        if present and (version < versions.first or (versions.last is not None and version > versions.last)):
            if versions.last is None:
                written = f"from format version {versions.first} on"
            elif versions.last == versions.first:
                written = f"by format version {versions.first}"
            else:
                written = f"by format versions {versions.first}–{versions.last}"
            raise VkvError(
                f"{path}: field {name}: written only {written}, not by the version {version} the header claims "
                "(its format_version was edited)"
            )


def _check_transcript(path: Path, record: Any) -> None:
    """Refuse a transcript record whose window is not messages [first, last) of a transcript of `tokens` tokens (each
    message renders at least one token)."""
    if record is None:
        return
    if not isinstance(record, dict):
        raise VkvError(f"{path}: field transcript: expected a record of the transcript, got {type(record).__name__}")
    window, tokens = record.get("window"), record.get("tokens")
    if window is None:
        return
    ints = isinstance(window, list) and len(window) == 2 and all(_integer(x) for x in window)
    if not (ints and _integer(tokens) and 0 <= window[0] < window[1] and window[1] - window[0] <= tokens):
        raise VkvError(
            f"{path}: field transcript.window: expected messages [first, last) with 0 ≤ first < last and at most the "
            f"{tokens!r} rendered tokens between them, got {window!r}"
        )


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_signature(path: str | Path, header: dict[str, Any], trust_foreign: bool = False) -> None:
    """Refuse a file not signed with this user's key over exactly its header (another user's, an edited one, or one
    older than signatures), unless `trust_foreign`: then only its digest and plausibility vouch for it."""
    if not isinstance(trust_foreign, bool):
        raise VkvError(f"trust_foreign: expected True or False, got {type(trust_foreign).__name__}")
    reason = None if trust_foreign else unsigned_reason(header, SIGNED_SINCE)
    if reason is not None:
        raise VkvError(f"{path}: field {reason}; {TRUST_HOW}")


def integrity(header: dict[str, Any]) -> str:
    """What `vkv inspect` says of a file that `verify` accepted: whether this user's signature and a digest vouch for
    it, or what was trusted instead."""
    reason = unsigned_reason(header, SIGNED_SINCE)
    if reason is None:
        return "signed with your key; sha256 digest verified"
    if "digest" in header:
        return f"sha256 digest verified; trusted with --trust-foreign, its {reason}"
    return (
        f"unverified: format version {header.get('format_version')} predates the digest, so only the tensors' "
        "shapes (and, when loaded with a model, their plausibility) are checked; trusted with --trust-foreign"
    )


def trusted_header(path: str | Path, trust_foreign: bool = False) -> dict[str, Any]:
    """`read_header`, and `check_signature`: what a command reads before it loads a model for the file."""
    header = read_header(path)
    check_signature(path, header, trust_foreign)
    return header


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for truncated or corrupt data
        raise VkvError(f"{path}: tensor data is truncated or corrupt ({exc})") from exc


def verify(path: str | Path, trust_foreign: bool = False) -> dict[str, Any]:
    """The header of a cache file whose signature, header and tensors were checked in full (`vkv inspect`)."""
    header = trusted_header(path, trust_foreign)
    tensors = read_tensors(Path(path))
    check_cache(path, header, tensors)
    check_digest(path, header, tensors)
    return header


def read_cache(
    path: str | Path, fingerprint: str | None = None, trust_foreign: bool = False
) -> SplicedCache | StoredCache:
    """Read a cache file without a model: a `kv` file as a SplicedCache, an embeddings-only one as the StoredCache a
    model rebuilds (`vkv.lm.rebuild.load_cache`). With `fingerprint`, refuse a file built for another model. The file
    is checked in full first: its signature (`check_signature`; `trust_foreign` skips it), then `vkv.kv.check`."""
    p = Path(path)
    header = trusted_header(p, trust_foreign)
    store = header.get("store", "kv")
    if store not in STORES:
        raise VkvError(f"{p}: field store: unknown store {store!r} (this vkv reads {', '.join(STORES)})")
    if fingerprint is not None and header.get("fingerprint") != fingerprint:
        raise VkvError(
            f"{p}: field fingerprint: cache was built for model '{header.get('model')}' "
            f"({header.get('fingerprint')}), not for the model in hand ({fingerprint})"
        )
    tensors = read_tensors(p)
    check_cache(p, header, tensors)
    spec = header.get("spec", {})
    expected = (spec.get("num_layers"), spec.get("num_kv_heads"), spec.get("head_dim"))
    meta = {k: v for k, v in header.items() if k not in ("segments", "next_position", "store", *HEADER_FIELDS)}
    rows = header.get("segments", [])
    counted = header["format_version"] >= COUNTED_SINCE
    if store == "embeddings":
        stored = [_stored_from(tensors, i, row, spec, p, counted) for i, row in enumerate(rows)]
        check_digest(p, header, tensors)
        return StoredCache(stored, int(header["next_position"]), meta)
    cache = SplicedCache(meta=meta)
    working = dict(tensors)  # _segment_from unpacks flat segments in it; the digest reads the file's own
    for i, row in enumerate(rows):
        cache.segments.append(_segment_from(working, i, row, expected, p, counted))
    check_digest(p, header, tensors)
    cache.next_position = int(header["next_position"])
    return cache


def _segment_from(tensors, i: int, row: dict, expected: tuple, path: Path, counted: bool) -> Segment:
    if f"segments.{i}.real" in tensors:
        _unflat(tensors, i, f"{path}: field segments[{i}]")
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
    bias, separable = _bias_from(tensors, i, tuple(keys.shape[:3]), where)
    _check_reached(row, bias, tuple(keys.shape[:3]), where, counted)
    embeddings = tensors.get(f"segments.{i}.embeddings")
    return Segment(
        row["kind"], tuple(row["span"]), keys, values, positions, embeddings, row.get("stats", {}), bias, separable
    )


def _stored_from(tensors, i: int, row: dict, spec: dict, path: Path, counted: bool) -> StoredSegment:
    """Segment i of an embeddings-only file: verbatim token ids or virtual embeddings, checked against the table."""
    where = f"{path}: field segments[{i}]"
    kind, span, entries = row.get("kind"), tuple(row.get("span", ())), row.get("entries")
    if kind not in ("verbatim", "virtual"):
        raise VkvError(f"{where}.kind: an embeddings-only file holds verbatim and virtual segments, not {kind!r}")
    name = "ids" if kind == "verbatim" else "embeddings"
    data, positions = tensors.get(f"segments.{i}.{name}"), tensors.get(f"segments.{i}.positions")
    if data is None or positions is None:
        raise VkvError(f"{where}: a {kind} segment of an embeddings-only file needs tensors {name} and positions")
    shape = (entries,) if kind == "verbatim" else (entries, spec.get("hidden_size"))
    if tuple(data.shape) != shape or positions.shape != (entries,):
        raise VkvError(
            f"{where}.{name}: expected shape {shape} and {entries} positions (the table's entries), "
            f"got {tuple(data.shape)} and {positions.numel()}"
        )
    if kind == "verbatim":
        if (
            len(span) != 2
            or span[1] - span[0] != entries
            or not torch.equal(positions.float(), torch.arange(*span).float())
        ):
            raise VkvError(f"{where}.span: {entries} token ids at their positions cannot stand for tokens {list(span)}")
        vocab = spec.get("vocab_size") or 0
        if data.is_floating_point() or (entries and not 0 <= int(data.min()) <= int(data.max()) < vocab):
            raise VkvError(f"{where}.ids: token ids must be integers below the vocabulary size {vocab}")
    slots = (spec.get("num_layers"), spec.get("num_kv_heads"), entries)
    bias, separable = _bias_from(tensors, i, slots, where)
    _check_reached(row, bias, slots, where, counted)
    ids = data.tolist() if kind == "verbatim" else None
    embeddings = data.float() if kind == "virtual" else None
    return StoredSegment(kind, span, positions.float(), ids, embeddings, bias, row.get("stats", {}), separable)


def _bias_from(tensors, i: int, shape: tuple, where: str) -> tuple[torch.Tensor | None, SeparableBias | None]:
    """Segment i's bias `[layers, kv_heads, entries]` = `shape` (version 1: from its `mass`; version 4: from its
    separable form, see `_separable_from`), or None; and that separable form, or None."""
    bias = tensors.get(f"segments.{i}.bias")
    separable = _separable_from(tensors, i, shape, where)
    if separable is not None:
        bias = separable.dense()
    mass = tensors.get(f"segments.{i}.mass")  # version 1: proportional attention's token counts
    if mass is not None:
        if mass.shape != (shape[2],) or not bool((mass > 0).all()):
            raise VkvError(f"{where}: mass must hold one positive count per entry, got shape {tuple(mass.shape)}")
        bias = mass_bias(mass, *shape[:2])
    # −inf is a padding slot of a head-wise budget (compress/head_budget.py); NaN and +inf are corruption
    if bias is not None and (tuple(bias.shape) != shape or bool((bias.isnan() | (bias == float("inf"))).any())):
        raise VkvError(
            f"{where}.bias: expected finite values (or −inf for padding) of shape (layers, kv_heads, entries) = "
            f"{shape}, got {tuple(bias.shape)}"
        )
    return bias, separable


def _check_reached(row: dict, bias: torch.Tensor | None, slots: tuple, where: str, counted: bool) -> None:
    """Refuse a segment whose reachable slots (finite bias) are not as many as its table row records (`reached`;
    absent: every slot), so that a mask flipped after writing is refused even with the digest recomputed, unless the
    count was edited with it."""
    if "reached" not in row and not counted:
        return  # the row may predate `reached`, which version 4 began writing late
    expected = row.get("reached", torch.Size(slots).numel())
    found = torch.Size(slots).numel() if bias is None else int(torch.isfinite(bias).sum())
    if found != expected:
        raise VkvError(
            f"{where}.reached: the segment's masks let attention reach {found} slots, its table row records {expected}"
        )


def _separable_from(tensors, i: int, shape: tuple, where: str) -> SeparableBias | None:
    """Segment i's bias as `_bias_tensors` stores it in per-entry and per-head form, checked against `shape`
    `(layers, kv_heads, entries)`; None when the file stores no such form."""
    names = ("bias_per_entry", "bias_per_head", "bias_mask")
    parts = [tensors.get(f"segments.{i}.{name}") for name in names]
    if all(p is None for p in parts):
        return None
    per_entry, per_head, packed = parts
    if (
        any(p is None for p in parts)
        or tuple(per_entry.shape) != shape[2:]
        or tuple(per_head.shape) != shape[:2]
        or packed.dtype != torch.uint8
        or tuple(packed.shape) != (-(-torch.Size(shape).numel() // 8),)
    ):
        raise VkvError(
            f"{where}.bias_mask: a separable bias needs {', '.join(names)} of shapes {shape[2:]}, {shape[:2]} and "
            f"the {torch.Size(shape).numel()} mask bits of (layers, kv_heads, entries) = {shape} packed as uint8"
        )
    return SeparableBias(per_entry.float(), per_head.float(), _unpack_bits(packed, shape))
