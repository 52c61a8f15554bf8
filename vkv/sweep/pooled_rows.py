"""The report's main table: one row per variant × requested ratio, pooled over windows, questions and seeds the way
`vkv eval` pools them."""

from __future__ import annotations

from typing import Any

from vkv.evals.intervals import window_bootstrap
from vkv.evals.metrics import mean
from vkv.evals.summary import aggregate
from vkv.sweep.variants import SweepResults, groups, question_values, row_order


def rows(results: SweepResults) -> list[dict[str, Any]]:
    """One row per variant × requested ratio, quality metrics pooled by `aggregate` (as in `vkv eval`), with 95 %
    intervals for retention, recall kept, choice and keyword accuracy from a bootstrap over windows."""
    out = []
    for (variant, _ratio), group in groups(results).items():
        pooled = aggregate([{**g["result"], "method": variant} for g in group], by_transcript=False)[0]
        losses = [g["result"]["optimisation"].get("best_loss") for g in group if g["result"].get("optimisation")]
        retention = window_bootstrap(question_values(group, "retention"))
        choice = window_bootstrap(question_values(group, "choice_correct"))
        keyword = window_bootstrap(question_values(group, "keyword_correct"))
        recall = window_bootstrap(question_values(group, "cloze_correct"))
        out.append(
            {
                **pooled,
                "variant": variant,
                "method": group[0]["run"]["method"],
                "runs": len(group),
                "windows": len({g["result"]["transcript"] for g in group}),
                "seeds": len({g["seed"] for g in group}),
                "retention_ci": (retention.low, retention.high) if retention else None,
                "choice_ci": (choice.low, choice.high) if choice else None,
                "keyword_ci": (keyword.low, keyword.high) if keyword else None,
                "recall_ci": (recall.low, recall.high) if recall else None,
                "compress_seconds": mean(g["result"]["seconds"] for g in group),
                "run_seconds": mean(g["wall_seconds"] for g in group),
                "final_loss": mean(x for x in losses if x is not None),
                "peak_memory_mb": max(g["peak_memory_mb"] for g in group),
                "peak_per_process": all(g.get("peak_memory_kind") == "process-max-rss" for g in group),
            }
        )
    return sorted(out, key=row_order)
