"""`vkv report DIR`: tables, plots and report.md from a sweep's results files, and nothing else.

Every number shown is read from DIR/results*.jsonl (`vkv.sweep.variants`). Rows are one method variant × requested
ratio, pooled over windows, questions and seeds the way `vkv eval` pools them (`vkv.sweep.pooled_rows`); the console
tables, the PNGs and report.md each have their own module.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from vkv.io import write_text_atomic
from vkv.settings import setting
from vkv.sweep.console_tables import print_tables
from vkv.sweep.paired import paired
from vkv.sweep.pooled_rows import rows
from vkv.sweep.report_markdown import markdown
from vkv.sweep.report_plots import plots
from vkv.sweep.variants import load


@dataclass
class ReportConfig:
    """`vkv report DIR`'s flags (DIR, the sweep's results directory, is its positional argument)."""

    out: str | None = setting(None, "where to write report.md and the PNGs (default: DIR/report)")
    vs: str | None = setting(
        None,
        "also show every method's paired difference from this reference "
        "(a method, or a variant label as the table prints it), with 95%% intervals; LABEL@RATIO compares every row "
        "with the reference's row at that ratio",
        metavar="METHOD",
    )


def run_report(directory: str | Path, config: ReportConfig | None = None) -> int:
    """Print the tables for the sweep results in `directory`; write report.md and the PNGs."""
    config = config or ReportConfig()
    console = Console()
    if not console.is_terminal:  # piped or captured: wide enough for the tables
        console = Console(width=200)
    results = load(directory)
    out = Path(config.out) if config.out else results.directory / "report"
    table_rows = rows(results)
    paired_rows = paired(results, config.vs) if config.vs else None
    print_tables(console, results, table_rows, paired_rows)
    reference = paired_rows[0]["reference"].split(" @")[0] if paired_rows else None  # "LABEL @RATIOx": the label
    images = plots(results, table_rows, out, reference)
    if not images:
        console.print("[yellow]no plots: matplotlib is not installed (pip install 'vkv[plots]')[/]")
    write_text_atomic(out / "report.md", markdown(results, table_rows, images, paired_rows))
    console.print(f"wrote {out / 'report.md'}" + (f" and {', '.join(images)}" if images else ""))
    return 0
