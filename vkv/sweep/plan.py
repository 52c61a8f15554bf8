"""Runs: grid points × the windows (or spans) they evaluate, each with a stable id; and shards of them.

A run's id is a hash of everything that decides its result: model, resolved quantisation, the evaluated window
(transcript id, content hash, turns), method, ratio, the method's fully resolved config, seed and eval
settings. The code revision is recorded with each result, not hashed, so a code change does not re-run a grid."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import AutoTokenizer

from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings
from vkv.lm.load import resolve_device, resolve_model_path, resolve_quant
from vkv.sweep.grid import UNIT_KEYS, Experiment, build_method, canonical, eval_keys, expand
from vkv.text.transcript import load_transcript, parse_turn_span, render
from vkv.text.windows import select_windows, window_transcript


@dataclass
class Unit:
    """One evaluated context: a window (system message + some turns) or a span of a whole transcript."""

    transcript: Any  # vkv.transcript.Transcript, possibly a window of the file's transcript
    turns: tuple[int, int] | None
    key: dict  # identity: transcript id, content hash, context kind, turns

    @property
    def label(self) -> str:
        return self.key["unit"]


@dataclass
class Run:
    id: str
    point: dict  # declared grid point (options its method takes)
    unit: Unit
    identity: dict  # everything hashed into the id

    @property
    def group(self) -> tuple[str, str]:
        return self.point["model"], self.identity["quant"]


def units_for(experiment: Experiment, point: dict, tokenizer_of: Callable[[str], Any]) -> list[Unit]:

    path = experiment.resolve(point["transcript"])
    if not path.is_file():
        raise VkvError(f"{experiment.path}: field transcripts: no such file {point['transcript']} (looked at {path})")
    transcript = load_transcript(path)
    limit = point.get("max_windows")
    if "window" in point:
        subs = select_windows(transcript, render(transcript, tokenizer_of(point["model"])), point["window"], limit)
        return [_unit(sub, None, transcript, "window") for sub in subs]
    if "window_turns" in point:
        return [
            _unit(sub, None, transcript, "window")
            for sub in turn_count_windows(transcript, point["window_turns"], limit)
        ]
    turns = parse_turn_span(point.get("span"), transcript)
    return [_unit(transcript, turns, transcript, "span")]


def _unit(sub, turns, parent, kind: str) -> Unit:
    turns = turns or sub.default_span()
    label = sub.id if kind == "window" else f"{sub.id}@span{turns[0]}-{turns[1] - 1}"
    return Unit(
        sub,
        turns if kind == "span" else None,
        {
            "unit": label,
            "transcript": parent.id,
            "sha256": parent.sha256,
            "context": kind,
            "turns": list(turns),
            "messages": len(sub.messages),
        },
    )


def turn_count_windows(transcript, n: int, limit: int | None):
    """Windows of n consecutive messages after the system message that carry questions, most questions first."""
    if not isinstance(n, int) or n < 1:
        raise VkvError(f"window_turns must be a positive number of messages, got {n!r}")
    first, end = transcript.default_span()
    subs = [window_transcript(transcript, a, min(a + n, end)) for a in range(first, end, n)]
    ranked = sorted((s for s in subs if s.questions), key=lambda s: -len(s.questions))
    chosen = {id(s) for s in (ranked[:limit] if limit else ranked)}
    return [s for s in subs if id(s) in chosen]


def plan(experiment: Experiment, device: str = "auto") -> list[Run]:
    """Every run of the experiment, each once, grouped by model then unit (file order within)."""
    dev = resolve_device(device)
    settings = {**eval_keys(), **experiment.eval}
    EvalSettings(**settings)  # type check early
    tokenizers: dict[str, Any] = {}
    units: dict[str, list[Unit]] = {}
    runs: dict[str, Run] = {}
    for point in expand(experiment):
        unit_spec = canonical({k: point.get(k) for k in ("model", "transcript", *UNIT_KEYS)})
        if unit_spec not in units:
            units[unit_spec] = units_for(experiment, point, lambda m: _tokenizer(m, tokenizers))
        try:
            method = build_method(point)
        except VkvError as exc:
            raise VkvError(f"{experiment.path}: {exc}") from None
        for unit in units[unit_spec]:
            identity = {
                "model": point["model"],
                "quant": resolve_quant(point["quant"], dev),
                **unit.key,
                "method": point["method"],
                "ratio": point["ratio"],
                "config": method.config(),
                "seed": point["seed"],
                "eval": settings,
            }
            run_id = identity_hash(identity)
            runs.setdefault(run_id, Run(run_id, point, unit, identity))
    order = {}
    return sorted(
        runs.values(), key=lambda r: (order.setdefault(r.group, len(order)), order.setdefault(r.unit.label, len(order)))
    )


def identity_hash(identity: dict) -> str:
    """A run's id: the first 16 hex digits of the SHA-256 of its identity's canonical JSON."""
    return hashlib.sha256(canonical(identity).encode()).hexdigest()[:16]


def _tokenizer(model: str, cache: dict):
    if model not in cache:
        path, local = resolve_model_path(model)
        try:
            cache[model] = AutoTokenizer.from_pretrained(path, local_files_only=local)
        except OSError as exc:
            raise VkvError(f"could not load the tokenizer of '{model}': {str(exc).splitlines()[0]}") from exc
    return cache[model]


# ---- sharding ---------------------------------------------------------------------------------------------


def parse_shard(text: str | None) -> tuple[int, int]:
    """'i/n' → (i, n); None → RANK/WORLD_SIZE from torchrun or accelerate launch, else (0, 1)."""
    if text is None:
        rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if rank is None or world is None:
            return 0, 1
        text = f"{rank}/{world}"
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise VkvError(f"--shard {text!r}: expected i/n, e.g. 0/2") from None
    if not 0 <= i < n:
        raise VkvError(f"--shard {text!r}: need 0 ≤ i < n")
    return i, n


def take_shard(runs: list[Run], i: int, n: int) -> list[Run]:
    """Shard i of n: whole windows (every run of a model and unit), so that each window's full and none references
    are computed by one shard only; the largest windows first, each to the shard with the fewest runs so far. Shards
    are disjoint, cover the grid and differ by at most one window's runs."""
    units: dict[tuple, list[str]] = {}
    for r in runs:
        units.setdefault((r.group, r.unit.label), []).append(r.id)
    # with more shards than windows, each window fills the first empty shard: the shards past the windows stay empty,
    # so only as many loads as windows are kept (any n costs no memory)
    n = min(n, max(len(units), 1))
    if i >= n:
        return []
    load, mine = [0] * n, set()
    for _unit_key, ids in sorted(units.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        shard = load.index(min(load))
        load[shard] += len(ids)
        if shard == i:
            mine.update(ids)
    return [r for r in runs if r.id in mine]
