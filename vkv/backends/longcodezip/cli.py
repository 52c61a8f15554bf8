"""What `vkv prune FILE --backend longcodezip …` calls.

`prune_file` takes plain keyword arguments; `run_prune(args)` maps an argparse namespace onto it
(optional attributes the main parser does not define fall back to defaults). User mistakes raise VkvError.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vkv.backends.longcodezip.languages import detect_language
from vkv.backends.longcodezip.pruner import LongCodeZip
from vkv.backends.longcodezip.settings import LongCodeZipSettings
from vkv.backends.longcodezip.source import read_source
from vkv.errors import VkvError
from vkv.io import write_json_atomic
from vkv.lm.frozen import FrozenLM
from vkv.lm.load import DEFAULT_MODEL, load_model


def prune_file(
    path: str | Path,
    *,
    query: str | None,
    budget: int | None = None,
    ratio: float | None = None,
    language: str | None = None,
    settings: LongCodeZipSettings | None = None,
    model: str = DEFAULT_MODEL,
    line_model: str | None = None,
    quant: str = "auto",
    device: str | None = None,
    json_path: str | Path | None = None,
    lm: FrozenLM | None = None,
    line_lm: FrozenLM | None = None,
) -> dict[str, Any]:
    """Prune one file for `query` under `budget` tokens or `ratio`; write the payload to `json_path` if set.

    The language comes from the extension unless `language` overrides it. Pass `lm` (and `line_lm`)
    to reuse loaded models; otherwise `model` (and `line_model`, default: the same) are loaded.
    Returns the payload: pruned text, token counts, kept lines and the backend's report.
    """
    if not query or not query.strip():
        raise VkvError("--query is required for the longcodezip backend: the request the pruned file must serve")
    text = read_source(path)
    spec = detect_language(path, language)
    if lm is None:
        lm = load_model(model, quant=quant, device=device)
    if line_lm is None and line_model and line_model != lm.name:
        line_lm = load_model(line_model, quant=quant, device=device)
    pruner = LongCodeZip(lm, line_lm, settings)
    result = pruner.prune(text, query, budget=budget, ratio=ratio, language=spec.name)
    payload = {
        "file": str(path),
        "backend": pruner.name,
        "language": spec.name,
        "query": query,
        "original_tokens": result.original_tokens,
        "compressed_tokens": result.compressed_tokens,
        "ratio_achieved": result.ratio_achieved,
        "kept_lines": result.kept_lines,
        "text": result.text,
        "report": result.report,
    }
    if json_path:
        write_json_atomic(json_path, payload)
    return payload


def run_prune(args: argparse.Namespace, lm: FrozenLM | None = None, line_lm: FrozenLM | None = None) -> dict[str, Any]:
    """`prune_file` from parsed flags: file, query, ratio, budget, language, rank_only, json, and
    optionally model, line_model, quant, device, alpha, beta, fine_keep, max_chunk_tokens."""
    return prune_file(
        args.file,
        query=_option(args, "query", None),
        budget=_option(args, "budget", None),
        ratio=_option(args, "ratio", None),
        language=_option(args, "language", None),
        settings=settings_from_args(args),
        model=_option(args, "model", DEFAULT_MODEL),
        line_model=_option(args, "line_model", None),
        quant=_option(args, "quant", "auto"),
        device=_option(args, "device", None),
        json_path=_option(args, "json", None),
        lm=lm,
        line_lm=line_lm,
    )


def settings_from_args(args: argparse.Namespace) -> LongCodeZipSettings:
    defaults = LongCodeZipSettings()
    return LongCodeZipSettings(
        alpha=_option(args, "alpha", defaults.alpha),
        beta=_option(args, "beta", defaults.beta),
        fine_keep=_option(args, "fine_keep", defaults.fine_keep),
        rank_only=bool(_option(args, "rank_only", False)),
        max_chunk_tokens=_option(args, "max_chunk_tokens", defaults.max_chunk_tokens),
    )


def _option(args: argparse.Namespace, name: str, default):
    value = getattr(args, name, None)
    return default if value is None else value
