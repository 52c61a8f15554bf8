"""Retention broken down below a table row: by a question field (distance to the evidence, question kind), by
transcript, and question by question."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from vkv.evals.intervals import window_bootstrap
from vkv.evals.metrics import mean
from vkv.evals.summary import aggregate, base_transcript
from vkv.sweep.plots import column_label
from vkv.sweep.pooled_rows import rows
from vkv.sweep.variants import SweepResults, groups, row_order

DISTANCE_BUCKETS = (0, 128, 512, 2048, 4096)  # tokens between a question's nearest evidence and the span's end


def _bucket(tokens: int) -> str:
    edges = [*DISTANCE_BUCKETS, None]
    for low, high in zip(edges, edges[1:]):
        if high is None or tokens < high:
            return f"{low}–{high - 1}" if high else f"≥{low}"
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Cell:
    """Mean retention of a breakdown's cell, its usable questions and its window-bootstrap interval."""

    mean: float
    questions: int
    low: float
    high: float
    windows: int = 0


def breakdown(results: SweepResults, field_name: str) -> tuple[list[str], dict[tuple, dict[str, Cell]]]:
    """(columns, {(variant, ratio): {column: Cell}}) for `distance_tokens` (bucketed) or `kind`, seeds averaged per
    question; questions without the field are left out."""
    if field_name not in results.breakdowns:
        results.breakdowns[field_name] = _breakdown(results, field_name)
    return results.breakdowns[field_name]


def _breakdown(results: SweepResults, field_name: str) -> tuple[list[str], dict[tuple, dict[str, Cell]]]:
    label = _bucket if field_name == "distance_tokens" else str
    cells: dict[tuple, dict[str, dict]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for key, group in groups(results).items():
        for line in group:
            window = line["result"]["transcript"]
            for q in line["result"]["questions"]:
                if q.get(field_name) in (None, "") or q["weak"] or q["retention"] is None:
                    continue
                cells[key][label(q[field_name])][(window, q["id"])].append(q["retention"])
    if field_name == "distance_tokens":
        order = [_bucket(b) for b in DISTANCE_BUCKETS]
        columns = [c for c in order if any(c in row for row in cells.values())]
    else:
        columns = sorted({c for row in cells.values() for c in row})
    return columns, {key: {c: _cell_interval(values) for c, values in row.items()} for key, row in cells.items()}


def _cell_interval(values: dict[tuple, list[float]]) -> Cell:
    interval = window_bootstrap({k: sum(v) / len(v) for k, v in values.items()})
    return Cell(interval.mean, interval.questions, interval.low, interval.high, interval.windows)


def per_transcript(results: SweepResults) -> tuple[list[str], list[tuple[str, Any]], dict]:
    """(transcripts, (variant, ratio) rows in table order, {(variant, ratio, transcript): pooled row}): each
    transcript's windows pooled as in `vkv eval`."""
    grouped: dict[tuple, list[dict]] = defaultdict(list)
    for line in results.lines:
        result = line["result"]
        grouped[(line["variant"], result["ratio_requested"], base_transcript(result))].append(result)
    cells = {key: aggregate([{**r, "method": key[0]} for r in group])[0] for key, group in grouped.items()}
    transcripts = sorted({key[2] for key in cells})
    order = {(r["variant"], r["ratio_requested"]): i for i, r in enumerate(rows(results))}
    keys = sorted({key[:2] for key in cells}, key=lambda k: order.get(k, len(order)))
    return transcripts, keys, cells


def per_question(results: SweepResults, metric: str = "keyword_correct") -> tuple[list[str], list[str], list[list]]:
    """(columns, rows, fractions): per window/question, the share of runs answering correctly per variant × ratio.
    Rows: questions the full context answers first, and among them those that survive most compression first,
    so the facts that degrade first sit at the bottom of the known ones."""
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    columns: dict[str, tuple] = {}
    for line in results.lines:
        r = line["result"]
        column = column_label(line["variant"], r["ratio_requested"])
        columns[column] = row_order(
            {"method": line["run"]["method"], "variant": line["variant"], "ratio_requested": r["ratio_requested"]}
        )
        for q in r["questions"]:
            cells[(f"{r['transcript']} / {q['id']}", column)].append(float(q[metric]))
    cols = sorted(columns, key=columns.get)
    names = sorted({name for name, _ in cells})
    grid = [[mean(cells[(n, c)]) if (n, c) in cells else None for c in cols] for n in names]
    full = [i for i, c in enumerate(cols) if c == "full"]
    order = sorted(
        range(len(names)),
        key=lambda i: (-sum(grid[i][j] or 0.0 for j in full), -sum(v or 0.0 for v in grid[i]), names[i]),
    )
    return cols, [names[i] for i in order], [grid[i] for i in order]
