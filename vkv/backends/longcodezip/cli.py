"""What `vkv prune FILE --backend longcodezip …` calls: `prune_file`, with plain keyword arguments (vkv.cli.prune
maps the command's config onto them). User mistakes raise VkvError.
"""

from __future__ import annotations

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
