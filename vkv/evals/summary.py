"""Aggregate per-window results into one row per (transcript, method, ratio): pooled over questions."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from vkv.evals.cloze import recall_summary
from vkv.evals.metrics import mean
from vkv.upgrade import method_label


def base_transcript(result: dict[str, Any]) -> str:
    return result["transcript"].split("@", 1)[0]


def aggregate(results: Iterable[dict[str, Any]], by_transcript: bool = True) -> list[dict[str, Any]]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        method = method_label(r["method"]) + (" (question-aware)" if r.get("question_aware") else "")
        key = (base_transcript(r) if by_transcript else "*", method, r.get("ratio_requested"))
        groups[key].append(r)
    rows = []
    for (transcript, method, ratio), rs in groups.items():
        questions = [q for r in rs for q in r["questions"]]
        usable = [q for q in questions if not q["weak"]]
        span = sum(r["span_tokens"] for r in rs)
        entries = sum(r["compressed_entries"] for r in rs)
        # slots, what a padded cache stores: known only if every run recorded them (older runs did not)
        stored = sum(r["stored_entries"] for r in rs) if all("stored_entries" in r for r in rs) else None
        # Bytes the decoding cache holds for the span: known only for runs since the ragged cache recorded them
        in_memory = all(r.get("span_memory_bytes") is not None for r in rs)
        span_bytes = sum(r["span_memory_bytes"] for r in rs) if in_memory else None
        full_bytes = sum(r["span_full_bytes"] for r in rs) if in_memory else None
        rows.append(
            {
                "transcript": transcript,
                "method": method,
                "ratio_requested": ratio,
                "ratio_achieved": round(span / entries, 3) if entries else None,
                "ratio_stored": round(span / stored, 3) if stored else None,
                "ratio_memory": round(full_bytes / span_bytes, 3) if span_bytes else None,
                "span_memory_kib": round(span_bytes / len(rs) / 1024, 1) if span_bytes is not None else None,
                "windows": len(rs),
                "questions": len(questions),
                "weak": len(questions) - len(usable),
                "keyword_accuracy": mean(float(q["keyword_correct"]) for q in questions),
                "choice_accuracy": mean(float(q["choice_correct"]) for q in questions),
                "mean_retention": mean(q["retention"] for q in usable),
                "fidelity_kl": mean(q["fidelity_kl"] for q in questions),
                # None (shown —) where no run measured clozes: runs made before them, or with --no-cloze
                "recall_kept": None,
                "recall_questions": None,
                **recall_summary(questions),
                "seconds": round(sum(r["seconds"] for r in rs), 2),
            }
        )
    return rows
