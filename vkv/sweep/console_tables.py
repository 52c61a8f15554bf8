"""`vkv report`'s tables on the console (rich): the main table, paired differences, breakdowns, per question."""

from __future__ import annotations

from rich.table import Table

from vkv.sweep.breakdowns import breakdown, per_question
from vkv.sweep.table_cells import (
    COLUMNS,
    MARKDOWN_ONLY,
    PAIRED_COLUMNS,
    breakdown_cells,
    few_windows,
    format_cell,
    paired_cells,
    row_windows,
)
from vkv.sweep.variants import SweepResults, splits


def print_tables(console, results: SweepResults, table_rows: list[dict], paired_rows: list[dict] | None = None) -> None:
    sweeps = ", ".join(sorted({line["sweep"] for line in results.lines}))
    table = Table(
        title=f"{sweeps}, split {'+'.join(splits(results))}: {len(results.lines)} runs (pooled over "
        "windows, questions and seeds; 95% intervals resample windows)"
    )
    columns = [c for c in COLUMNS if c[1] not in MARKDOWN_ONLY]
    for header, _, _ in columns:
        table.add_column(header, justify="left" if header == "method" else "right")
    for row in table_rows:
        table.add_row(*(format_cell(row, key, fmt) for _, key, fmt in columns))
    console.print(table)
    caveat = few_windows(row_windows(table_rows))
    if caveat:
        console.print(f"[yellow]{caveat}[/]", highlight=False)
    if paired_rows:
        diff = Table(
            title="paired differences from the reference on shared questions (n.s.: the interval includes 0, "
            "not separable)"
        )
        for header in PAIRED_COLUMNS:
            diff.add_column(header, justify="left" if header in ("method", "vs") else "right")
        for row in paired_rows:
            diff.add_row(*paired_cells(row))
        console.print(diff)
    for field_name, title in (
        (
            "distance_tokens",
            "mean retention (usable questions) by tokens between the nearest evidence and the span's end",
        ),
        ("kind", "mean retention (usable questions) by question kind"),
    ):
        columns, cells = breakdown(results, field_name)
        if not columns:
            continue
        by = Table(title=title)
        by.add_column("method")
        by.add_column("ratio", justify="right")
        for c in columns:
            by.add_column(c, justify="right")
        for row in table_rows:
            key = (row["variant"], row["ratio_requested"])
            if key in cells:
                by.add_row(
                    row["variant"], format_cell(row, "ratio_requested", ".1f"), *breakdown_cells(columns, cells[key])
                )
        console.print(by)
    cols, names, grid = per_question(results)
    if len(cols) <= 16:
        q = Table(title="keyword-correct share per question (facts that degrade first at the bottom)")
        q.add_column("window / question")
        for c in cols:
            q.add_column(c, justify="right")
        for name, values in zip(names, grid):
            q.add_row(name, *("—" if v is None else f"{v:.2f}" for v in values))
        console.print(q)
    for e in results.errors:
        console.print(
            f"[red]failed run[/] {e.get('unit', '')} {e.get('method', '')} {e.get('ratio') or ''}: {e.get('error')}",
            highlight=False,
        )
