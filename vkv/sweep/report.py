"""`vkv report DIR`: tables, plots and report.md from a sweep's results files, and nothing else.

Every number shown is read from DIR/results*.jsonl (`vkv.sweep.variants`). Rows are one method variant × requested
ratio, pooled over windows, questions and seeds the way `vkv eval` pools them (`vkv.sweep.pooled_rows`); the console
tables, the PNGs and report.md each have their own module.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from vkv.errors import VkvError
from vkv.io import check_output, forcing, write_text_atomic
from vkv.settings import setting
from vkv.sweep.console_tables import print_tables
from vkv.sweep.paired import paired
from vkv.sweep.pooled_rows import rows
from vkv.sweep.report_markdown import markdown
from vkv.sweep.report_plots import PLOTS, plots
from vkv.sweep.results import skipped_sentences
from vkv.sweep.variants import load

REPORT_FILE = "report.md"


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


def run_report(directory: str | Path, config: ReportConfig | None = None, force: bool = False) -> int:
    """Print the tables for the sweep results in `directory`; write report.md and the PNGs (where files of another
    kind stand under their names, a report.md vkv did not write among them, only with `force`)."""
    config = config or ReportConfig()
    console = Console()
    if not console.is_terminal:  # piped or captured: wide enough for the tables
        console = Console(width=240)
    results = load(directory)
    for sentence in skipped_sentences(results.skipped):  # on stderr as well as in report.md: never dropped unsaid
        print(f"warning: {sentence}", file=sys.stderr)
    out = Path(config.out) if config.out else results.directory / "report"
    check_report_outputs(out, force)
    table_rows = rows(results)
    paired_rows = paired(results, config.vs) if config.vs else None
    print_tables(console, results, table_rows, paired_rows)
    reference = paired_rows[0]["reference"].split(" @")[0] if paired_rows else None  # "LABEL @RATIOx": the label
    with forcing(force):  # the PNGs are written deep in vkv.sweep.plots, checked as they were above
        images = plots(results, table_rows, out, reference)
    if not images:
        console.print("[yellow]no plots: matplotlib is not installed (pip install 'vkv[plots]')[/]")
    write_text_atomic(out / REPORT_FILE, markdown(results, table_rows, images, paired_rows), "report", "--out", force)
    console.print(f"wrote {out / REPORT_FILE}" + (f" and {', '.join(images)}" if images else ""))
    return 0


def check_report_outputs(out: Path, force: bool) -> None:
    """Refuse, before the tables and plots are made, an --out that is not a directory, or a file in it that the
    report would write and must not (vkv.io.check_output): report.md and the PNGs."""
    if os.path.lexists(out) and not out.is_dir():
        raise VkvError(f"{out}: field --out: not a directory; the report writes {REPORT_FILE} and its PNGs into one")
    if not out.is_dir():
        return  # made when the report is written: nothing in it yet to replace
    check_output(out / REPORT_FILE, "--out", "report", force)
    for image in PLOTS.values():
        check_output(out / image, "--out", "image", force)
