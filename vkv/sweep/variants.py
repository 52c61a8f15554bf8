"""A sweep's finished runs, read from DIR/results*.jsonl (merged across shards, each run once; failed runs from
DIR/errors*.jsonl), each labelled with its variant: a method plus the options that differ between its runs.
Everything `vkv report` shows is computed from these, grouped by variant × requested ratio."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vkv.errors import VkvError
from vkv.sweep.results import Skipped, read_results, skipped_sentences
from vkv.upgrade import method_label

REFERENCES = ("full", "none")


@dataclass
class SweepResults:
    directory: Path
    lines: list[dict]  # one per run: the sweep record with its eval JSON under "result"
    errors: list[dict] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    breakdowns: dict[str, tuple] = field(default_factory=dict, repr=False)  # breakdown()'s by field, computed once
    skipped: list[Skipped] = field(default_factory=list)  # lines of the results files that hold no run


def load(directory: str | Path) -> SweepResults:
    d = Path(directory)
    files = sorted(p.name for p in d.glob("results*.jsonl")) if d.is_dir() else []
    if not files:
        raise VkvError(f"{d}: no results*.jsonl here; run `vkv sweep CONFIG --out {d}` first")
    skipped: list[Skipped] = []
    lines = read_results(d, skipped=skipped, required="result")
    for line in lines:
        _check_line(line, d)
    if not lines:
        raise VkvError(
            f"{d}: the results files hold no finished runs yet" + "".join(f"; {s}" for s in skipped_sentences(skipped))
        )
    _label(lines)
    finished = {line["run_id"] for line in lines}
    errors = [
        e for e in read_results(d, "errors*.jsonl", latest=True, skipped=skipped) if e.get("run_id") not in finished
    ]
    return SweepResults(d, lines, errors, files, skipped=skipped)


def _check_line(line: dict, directory: Path) -> None:
    """Refuse, naming the field, a results line that `vkv sweep` did not write (another schema)."""
    number = (int, float)
    fields = {"run_id": str, "run": dict, "identity": dict, "result": dict, "git": dict, "seed": int}
    fields.update(wall_seconds=number, peak_memory_mb=number)
    for name, kind in fields.items():
        if not isinstance(line.get(name), kind) or isinstance(line.get(name), bool):
            raise VkvError(
                f"{directory}: field {name} of run {line.get('run_id')!r}: missing or of another type; "
                "the results files hold lines `vkv sweep` did not write"
            )
    for name in ("method", "model"):
        if not isinstance(line["run"].get(name), str):
            raise VkvError(f"{directory}: field run.{name} of run {line['run_id']!r}: missing")


def _label(lines: list[dict]) -> None:
    """Set line["variant"]: the method plus the settings in which its runs differ (from each run's fully resolved
    config and eval settings, seeds aside), and model/quant when the results hold more than one."""
    models = {(line["run"]["model"], line["identity"]["quant"]) for line in lines}
    by_method: dict[str, list[dict]] = defaultdict(list)
    for line in lines:
        by_method[line["run"]["method"]].append(line)
    for method, group in by_method.items():
        settings = [
            _flat({"config": line["identity"].get("config"), "eval": line["identity"].get("eval")}) for line in group
        ]
        keys = sorted({k for s in settings for k in s})
        varying = [k for k in keys if len({json.dumps(s.get(k)) for s in settings if not _under_none(s, k)}) > 1]
        names = {k: k.rsplit(".", 1)[-1] for k in varying}
        if len(set(names.values())) < len(names):
            names = {k: k.removeprefix("config.") for k in varying}
        for line, flat in zip(group, settings):
            parts = [method_label(method)] + [f"{names[k]}={_short(flat.get(k))}" for k in varying]
            if len(models) > 1:
                parts.insert(0, f"{line['run']['model'].split('/')[-1]}/{line['identity']['quant']}")
            line["variant"] = " ".join(parts)


def _under_none(flat: dict[str, Any], key: str) -> bool:
    """Whether `key` is absent from `flat` because a section above it is None there (reuse's `recipe` for a method
    without one): such a run says nothing about the key, and the section's absence is shown by another setting."""
    parts = key.split(".")
    return key not in flat and any(flat.get(".".join(parts[:i]), 0) is None for i in range(1, len(parts)))


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d} if prefix else {}
    out: dict[str, Any] = {}
    for k, v in d.items():
        if k in ("seed", "ratio"):  # seeds are pooled; the ratio is a column
            continue
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def _short(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return "—" if value is None else (f"{value:g}" if isinstance(value, float) else str(value))


def groups(results: SweepResults) -> dict[tuple[str, float | None], list[dict]]:
    """Sweep lines per (variant, requested ratio), in file order."""
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for line in results.lines:
        grouped[(line["variant"], line["result"]["ratio_requested"])].append(line)
    return grouped


def question_values(lines: list[dict], metric: str) -> dict[tuple[str, str], float]:
    """{(window, question id): metric} over these runs, seeds averaged; retention only for usable questions, and
    `cloze_correct` (recall kept) only for questions that count for recall (the full context completes their cloze;
    none in runs made before clozes)."""
    per: dict[tuple[str, str], list[float]] = defaultdict(list)
    for line in lines:
        result = line["result"]
        for q in result["questions"]:
            if metric == "retention" and (q["weak"] or q["retention"] is None):
                continue
            if metric == "cloze_correct" and not q.get("recall_counts"):
                continue
            per[(result["transcript"], q["id"])].append(float(q[metric]))
    return {k: sum(v) / len(v) for k, v in per.items()}


def splits(results: SweepResults) -> list[str]:
    """The transcript splits (dev/test) the runs were scored on; "unsplit" for transcripts outside them."""
    return sorted({line["result"].get("split") or "unsplit" for line in results.lines})


def row_order(row: dict) -> tuple:
    ref = REFERENCES.index(row["method"]) if row["method"] in REFERENCES else len(REFERENCES)
    return ref, row["variant"], row["ratio_requested"] or 0.0
