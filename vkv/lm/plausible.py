"""Whether a loaded cache's entries are plausible for the model that is to decode on them.

A digest only says that a file is the one that was written; anyone who edits a file can recompute it. What an edit
cannot avoid is leaving entries the model itself would not produce: keys or values orders of magnitude larger or
smaller than the model's, all-zero values, non-finite numbers, biases beyond any attention logit. The model gives the
scale: a short prefill of a fixed text (`probe`) yields each layer's and KV head's key and value RMS, and every
segment's entries (its padding aside) must lie within `BOUNDS` of them.

The bounds come from what every compression method really writes. On the test model (smollm2-135m) and
tests/fixtures/mini-agent.json, caches written by `vkv compress --method M` (M = vkv, kvzip, am, snapkv, knorm, kvopt,
and the default virtual tokens with and without verbatim entries, at ratios 2 to 32) keep each segment's per-head RMS,
as a multiple of the probe's, at 0.30–1.40 for keys and 0.09–1.65 for values, except the values am and kvopt fit by
least squares: up to 237× (am) and 174× (kvopt), on heads whose own values are small. Their biases lie within ±6, and
virtual tokens' embeddings at 0.50–1.35× the model's token embeddings. `BOUNDS` leaves a factor of at least 30 beyond
every one of these, so that what it refuses is an edit (×10⁶, ÷10⁶, zero), not a method.

What this cannot see is an edit that keeps magnitudes: values with their signs flipped, entries exchanged between
heads or slots, masks permuted with their counts kept, or values scaled within the bounds. The signature (vkv.kv.sign)
refuses such edits unless a file is loaded with `trust_foreign`; for such a file this check is what is left.

The statistics are kept in memory per model fingerprint and never read from disk, so that a file on disk cannot
widen the bounds a cache is held to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.kv.spliced import SplicedCache

# code and prose, as an agent's transcript mixes them; its RMS per head is what a segment's is compared with
PROBE_TEXT = (
    "The service stores users in SQLite through a small repository module. When a request arrives, the handler "
    "validates the body, hashes the password with bcrypt and inserts the row:\n\n"
    "def create_user(db, name: str, password: str) -> int:\n"
    "    digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(12))\n"
    "    cur = db.execute('INSERT INTO users (name, hash) VALUES (?, ?)', (name, digest))\n"
    "    return cur.lastrowid\n\n"
    "The tests run with pytest; 14 passed and 1 failed with exit code 1 because the migration was missing."
)
SINK_TOKENS = 4  # the first tokens' keys and values are atypical (attention sinks) and are left out of the scale
BOUNDS = {
    "keys": (1e-2, 1e2),
    "values": (1e-3, 1e4),
    "embeddings": (1e-2, 1e2),
}  # a head's RMS over the probe's (see the module docstring)
MAX_BIAS = 100.0  # no fitted bias comes near it, nor proportional attention's log of a token count (log 10⁶ ≈ 14)


@dataclass(frozen=True)
class ProbeStats:
    """Per layer and KV head `[layers, kv_heads]`: the RMS of the probe's keys and of its values."""

    keys: torch.Tensor
    values: torch.Tensor
    embeddings: float  # the median RMS of the model's token embeddings, the scale virtual tokens' inputs start from


_PROBES: dict[str, ProbeStats] = {}


def probe(lm) -> ProbeStats:
    """The model's own key and value scale per layer and KV head, from one prefill of `PROBE_TEXT` (kept per
    fingerprint for the process's lifetime)."""
    known = _PROBES.get(lm.fingerprint)
    if known is not None:
        return known
    ids = torch.as_tensor(lm.tokenizer(PROBE_TEXT, add_special_tokens=True)["input_ids"])[None].to(lm.device)
    with torch.no_grad():
        keys, values = lm.forward_kv(lm.embed(ids), torch.arange(ids.shape[1], device=lm.device), KVPrefix.empty())
    stats = ProbeStats(
        torch.stack([head_rms(k[0, :, SINK_TOKENS:].float().cpu()) for k in keys]),
        torch.stack([head_rms(v[0, :, SINK_TOKENS:].float().cpu()) for v in values]),
        float(lm.embedding_matrix.float().pow(2).mean(-1).sqrt().median()),
    )
    _PROBES[lm.fingerprint] = stats
    return stats


def head_rms(entries: torch.Tensor, reached: torch.Tensor | None = None) -> torch.Tensor:
    """RMS per head of `entries` `[heads, n, head_dim]` over the slots `reached` `[heads, n]` marks as holding
    entries (all: None); NaN for a head with none."""
    squares = entries.float().pow(2).mean(-1)
    if reached is None:
        return squares.mean(-1).sqrt()
    count = reached.sum(-1)
    total = (squares * reached).sum(-1)
    return torch.where(count > 0, (total / count.clamp(min=1)).sqrt(), torch.full_like(total, float("nan")))


def check_plausible(lm, cache: SplicedCache, path: str | Path) -> None:
    """Refuse, in one sentence naming the segment, layer, KV head and field, a cache whose entries this model could not
    have produced: non-finite keys, values or biases, all-zero values, a head's key or value RMS outside `BOUNDS` of
    the probe's, or a reachable bias beyond ±`MAX_BIAS`."""
    scale = probe(lm)
    for i, seg in enumerate(cache.segments):
        where = f"{path}: field segments[{i}]"
        reached = None if seg.bias is None else torch.isfinite(seg.bias).cpu()
        if seg.bias is not None:
            _check_bias(seg.bias.float().cpu(), where)
        if seg.embeddings is not None:
            _check_embeddings(seg.embeddings.float().cpu(), scale.embeddings, where)
        for name, tensor in (("keys", seg.keys), ("values", seg.values)):
            t = tensor.float().cpu()
            if not bool(torch.isfinite(t).all()):
                layer, head = _first(~torch.isfinite(t).all(-1).all(-1))
                raise VkvError(f"{where}.{name}: layer {layer}, KV head {head} holds numbers that are not finite")
            for layer in range(t.shape[0]):
                rms = head_rms(t[layer], None if reached is None else reached[layer])
                ratio = rms / getattr(scale, name)[layer].clamp(min=1e-30)
                _check_ratio(ratio, name, layer, where)


def _check_embeddings(embeddings: torch.Tensor, scale: float, where: str) -> None:
    # the model's normalisation hides an input's scale from the K/V it yields, so the inputs are checked themselves
    rms = embeddings.pow(2).mean(-1).sqrt() / max(scale, 1e-30)
    low, high = BOUNDS["embeddings"]
    bad = ~torch.isfinite(rms) | (rms < low) | (rms > high)
    if bool(bad.any()):
        entry = int(bad.nonzero()[0])
        raise VkvError(
            f"{where}.embeddings: entry {entry}: RMS {float(rms[entry]):.3g}× the model's token embeddings, outside "
            f"the plausible {low:g}–{high:g}×; the file was edited or built for another model"
        )


def _check_bias(bias: torch.Tensor, where: str) -> None:
    # −inf marks a padding slot; NaN, +inf and finite numbers past any logit are edits
    bad = bias.isnan() | (bias == float("inf")) | (torch.isfinite(bias) & (bias.abs() > MAX_BIAS))
    if bool(bad.any()):
        layer, head = _first(bad.any(-1))
        value = float(bias[layer, head][bad[layer, head]][0])
        raise VkvError(
            f"{where}.bias: layer {layer}, KV head {head} holds {value:g}, outside the finite range ±{MAX_BIAS:g} "
            "(or −inf for a padding slot)"
        )


def _check_ratio(ratio: torch.Tensor, name: str, layer: int, where: str) -> None:
    for head, r in enumerate(ratio.tolist()):
        if r != r:  # NaN: the head has no entry in this segment
            continue
        if r == 0 and name == "values":
            raise VkvError(f"{where}.values: layer {layer}, KV head {head}: every value it reaches is zero")
        low, high = BOUNDS[name]
        if not low <= r <= high:
            raise VkvError(
                f"{where}.{name}: layer {layer}, KV head {head}: RMS {r:.3g}× the model's own (a probe prefill), "
                f"outside the plausible {low:g}–{high:g}×; the file was edited or built for another model"
            )


def _first(mask: torch.Tensor) -> tuple[int, int]:
    """(layer, head) of the first True in `mask` `[layers, heads]`."""
    layer, head = (int(x) for x in mask.nonzero()[0])
    return layer, head
