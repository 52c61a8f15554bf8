"""How the report writes its numbers, the same in the console tables and in report.md: the main table's columns,
intervals, paired differences, breakdown cells, and the caveat for intervals over few windows."""

from __future__ import annotations

from vkv.sweep.breakdowns import Cell
from vkv.sweep.plots import FEW_WINDOWS

COLUMNS = (  # (header, row key, format)
    ("method", "variant", "s"),
    ("ratio", "ratio_requested", ".1f"),
    ("achieved", "ratio_achieved", ".2f"),
    ("stored", "ratio_stored", ".2f"),
    ("in memory", "ratio_memory", ".2f"),
    ("span KiB", "span_memory_kib", ".0f"),
    ("runs", "runs", "d"),
    ("questions", "questions", "d"),
    ("weak", "weak", "d"),
    ("keyword acc", "keyword_accuracy", ".3f"),
    ("choice acc", "choice_accuracy", ".3f"),
    ("choice 95% CI", "choice_ci", "ci"),
    ("retention", "mean_retention", ".3f"),
    ("retention 95% CI", "retention_ci", "ci"),
    ("recall kept", "recall_kept", ".3f"),
    ("recall 95% CI", "recall_ci", "ci"),
    ("recall n", "recall_questions", "d"),
    ("fidelity KL", "fidelity_kl", ".4f"),
    ("compress s", "compress_seconds", ".1f"),
    ("run s", "run_seconds", ".1f"),
    ("final loss", "final_loss", ".4f"),
    ("peak MB", "peak_memory_mb", ".0f"),
)


MARKDOWN_ONLY = (
    "ratio_stored",
    "recall_ci",
    "recall_questions",
    "run_seconds",
    "final_loss",
)  # left out of the console table, which must fit a terminal


def format_cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return "—"
    if key == "peak_memory_mb" and row.get("peak_per_process"):
        return "≤" + format(value, fmt)  # the sweep process's peak RSS so far: a bound, not this row's own peak
    return f"[{value[0]:.3f}, {value[1]:.3f}]" if fmt == "ci" else format(value, fmt)


def few_windows(items: list[tuple[str, int]]) -> str | None:
    """The caveat for intervals resting on fewer than FEW_WINDOWS windows (`items`: what, its windows), or None."""
    few = sorted({(what, windows) for what, windows in items if windows < FEW_WINDOWS}, key=lambda x: (x[1], x[0]))
    if not few:
        return None
    named = "; ".join(f"{what} ({windows} window{'s' if windows != 1 else ''})" for what, windows in few)
    return (
        f"Caveat: these intervals rest on fewer than {FEW_WINDOWS} windows, and a bootstrap over so few windows "
        f"understates the uncertainty (over one window it is no interval at all): {named}."
    )


def few_window_cells(rows: list[tuple[str, dict[str, Cell]]], columns: list[str]) -> str | None:
    """The caveat under a breakdown table: which of its cells (`rows`: a row's name, {column: Cell}) rest on fewer
    than FEW_WINDOWS windows, column by column with their windows, rows of the same pattern named together."""
    patterns: dict[tuple, list[str]] = {}
    for what, row in rows:
        few = tuple((c, row[c].windows) for c in columns if c in row and row[c].windows < FEW_WINDOWS)
        if few:
            patterns.setdefault(few, []).append(what)
    if not patterns:
        return None
    groups = [
        f"in {'every row' if len(names) == len(rows) else ', '.join(names)}: "
        + ", ".join(f"{c} ({w} window{'s' if w != 1 else ''})" for c, w in few)
        for few, names in patterns.items()
    ]
    return (
        f"Caveat: these cells rest on fewer than {FEW_WINDOWS} windows, and a bootstrap over so few windows "
        f"understates the uncertainty (over one window it is no interval at all): {'; '.join(groups)}."
    )


def row_windows(table_rows: list[dict]) -> list[tuple[str, int]]:
    return [
        (r["variant"] + (f" {r['ratio_requested']:g}×" if r["ratio_requested"] else ""), r.get("windows", 0))
        for r in table_rows
    ]


def _difference(interval) -> str:
    """`+0.042 [−0.010, +0.095] n.s.`: a paired difference, marked when its interval includes 0."""
    if interval is None:
        return "—"
    mark = "" if interval.separable else " n.s."
    return f"{interval.mean:+.3f} [{interval.low:+.3f}, {interval.high:+.3f}]{mark}"


PAIRED_COLUMNS = (
    "method",
    "ratio",
    "vs",
    "questions",
    "windows",
    "Δ retention [95% CI]",
    "Δ recall kept [95% CI]",
    "Δ choice acc [95% CI]",
)


def paired_cells(row: dict) -> list[str]:
    ret = row["retention"]
    return [
        row["variant"],
        "—" if row["ratio_requested"] is None else f"{row['ratio_requested']:.1f}",
        row["reference"],
        str(ret.questions if ret else 0),
        str(ret.windows if ret else 0),
        _difference(ret),
        _difference(row.get("recall")),  # None (—) for runs made before clozes
        _difference(row["choice"]),
    ]


def breakdown_cells(columns: list[str], row: dict[str, Cell]) -> list[str]:
    return [
        f"{row[c].mean:.3f} [{row[c].low:.2f}, {row[c].high:.2f}] ({row[c].questions})" if c in row else "—"
        for c in columns
    ]
