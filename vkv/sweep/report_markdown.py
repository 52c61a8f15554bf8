"""report.md: where the numbers come from, the results table, then each section that has data (paired
differences, breakdowns, plots with their captions, per transcript, per question, failed runs)."""

from __future__ import annotations

from vkv.io import REPORT_TITLE
from vkv.sweep.breakdowns import breakdown, per_question, per_transcript
from vkv.sweep.report_plots import PLOTS
from vkv.sweep.results import skipped_sentences
from vkv.sweep.table_cells import (
    COLUMNS,
    PAIRED_COLUMNS,
    breakdown_cells,
    few_window_cells,
    few_windows,
    format_cell,
    paired_cells,
    row_windows,
)
from vkv.sweep.variants import SweepResults, splits


def markdown(
    results: SweepResults, table_rows: list[dict], images: dict[str, list[str]], paired_rows: list[dict] | None = None
) -> str:
    """report.md: where the numbers come from, the results table, then each section that has data."""
    out = _markdown_header(results) + _markdown_results(table_rows)
    if paired_rows:
        out += _markdown_paired(paired_rows)
    out += _markdown_breakdowns(results, table_rows)
    out += _markdown_plots(images)
    out += _markdown_per_transcript(results) + _markdown_per_question(results)
    if results.errors:
        out += ["", "## Failed runs", ""]
        out += [
            f"- {e.get('unit', '')} {e.get('method', '')} {e.get('ratio') or ''}: {e.get('error')}"
            for e in results.errors
        ]
    return "\n".join(out) + "\n"


def _table_head(first: list[str], columns: list[str]) -> list[str]:
    """A markdown table's header and rule: the `first` columns, then `columns`; all but the first right-aligned."""
    head = [*first, *columns]
    rule = ["---"] + ["---:"] * (len(head) - 1)
    return ["| " + " | ".join(head) + " |", "|" + "|".join(rule) + "|"]


def _markdown_header(results: SweepResults) -> list[str]:
    lines = results.lines
    revisions = sorted(
        {
            (line["git"].get("revision") or "unknown")[:10] + ("+dirty" if line["git"].get("dirty") else "")
            for line in lines
        }
    )
    models = sorted({f"{line['run']['model']} ({line['identity']['quant']}, {line['device']})" for line in lines})
    units = sorted({line["result"]["transcript"] for line in lines})
    return [
        REPORT_TITLE + ", ".join(sorted({line["sweep"] for line in lines})),
        "",
        f"{len(lines)} finished runs read from {', '.join(results.files)} in `{results.directory}`; every "
        "number below comes from those files.",
        "",
        f"- transcript split: {', '.join(splits(results))}",
        f"- models: {'; '.join(models)}",
        f"- evaluated windows: {len(units)} ({', '.join(units)})",
        f"- code revisions: {', '.join(revisions)}",
        f"- failed runs: {len(results.errors)}",
    ] + [f"- {sentence}" for sentence in skipped_sentences(results.skipped)]


def _markdown_results(table_rows: list[dict]) -> list[str]:
    out = [
        "",
        "## Results",
        "",
        "Pooled over windows, questions and seeds. 95% intervals come from a bootstrap that resamples windows (the "
        "questions of one window are not independent). `compress s`: the method's own time per run; `run s`: wall "
        "time per run including scoring; `peak MB`: CUDA peak allocation per run, or on CPU (marked ≤) the sweep "
        "process's peak RSS, which only grows over the runs one process makes: a bound on each row's peak that does "
        "not compare rows; "
        "`achieved`: span tokens per entry per KV head; `stored`: span tokens per slot its segments "
        "hold (lower when head-wise budgets pad); `in memory`: the span's full K/V bytes over the bytes the decoding "
        "cache holds for its entries (keys, values, biases, per-head offsets), and `span KiB` those bytes per window; "
        "`recall kept`: of the `recall n` questions whose cloze form (the words before the keyword in the session) "
        "the full context completes with the keyword, the share this row completes; "
        "— for runs that did not record them.",
        "",
        "| " + " | ".join(h for h, _, _ in COLUMNS) + " |",
        "|" + "|".join("---" if h == "method" else "---:" for h, _, _ in COLUMNS) + "|",
    ]
    out += ["| " + " | ".join(format_cell(r, key, fmt) for _, key, fmt in COLUMNS) + " |" for r in table_rows]
    caveat = few_windows(row_windows(table_rows))
    return out + (["", f"**{caveat}**"] if caveat else [])


def _markdown_paired(paired_rows: list[dict]) -> list[str]:
    out = [
        "",
        f"## Paired differences from {paired_rows[0]['reference'].split()[0]}",
        "",
        "Method minus reference, question by question on the questions both were scored on, at the same "
        "requested ratio; 95% intervals resample windows. `n.s.`: the interval includes 0 (not separable). Recall "
        "kept: on the questions whose cloze the full context completes (— for runs made before clozes).",
        "",
        *_table_head(["method"], list(PAIRED_COLUMNS[1:])),
    ]
    out += ["| " + " | ".join(paired_cells(r)) + " |" for r in paired_rows]
    windows = [
        (f"{r['variant']} {r['ratio_requested'] or ''}".strip(), r["retention"].windows)
        for r in paired_rows
        if r.get("retention")
    ]
    caveat = few_windows(windows)
    return out + (["", f"**{caveat}**"] if caveat else [])


BREAKDOWNS = (  # (question field, section title, what the cells hold)
    (
        "distance_tokens",
        "Retention by distance",
        "Mean retention of usable questions [95% window-bootstrap interval] (and their count) by the number of "
        "tokens between the question's "
        "nearest evidence (its latest source turn in the span) and the end of the compressed span.",
    ),
    (
        "kind",
        "Retention by question kind",
        "Mean retention of usable questions [95% window-bootstrap interval] (and their count).",
    ),
)


def _markdown_breakdowns(results: SweepResults, table_rows: list[dict]) -> list[str]:
    out = []
    for field_name, title, note in BREAKDOWNS:
        columns, cells = breakdown(results, field_name)
        if not columns:
            continue
        out += ["", f"## {title}", "", note, "", *_table_head(["method", "ratio"], columns)]
        out += [
            f"| {r['variant']} | {format_cell(r, 'ratio_requested', '.1f')} | "
            + " | ".join(breakdown_cells(columns, cells[(r["variant"], r["ratio_requested"])]))
            + " |"
            for r in table_rows
            if (r["variant"], r["ratio_requested"]) in cells
        ]
        caveat = few_window_cells([(f"{v} {ratio or ''}".strip(), row) for (v, ratio), row in cells.items()], columns)
        out += ["", f"**{caveat}**"] if caveat else []
    return out


CAPTIONS = {
    PLOTS["quality"]: "## Quality vs achieved ratio and bytes in memory\n\nThe variants that are, at some requested "
    "ratio, among the 4 with the highest mean retention (and the `--vs` reference): the distance figure's rule, fewer "
    "where the palette's 8 colours would not cover them, so every drawn variant has its own colour and marker (each "
    "named by its method and the options that tell it apart, full labels under the figure); the notes name every variant left out. The ratio axes are ticked at "
    "the ratios measured, the memory axis at round MiB; points whose measured x lie closer than a marker's width are "
    "spread sideways in the legend's order, symmetrically and only as far as the markers need (the notes give by "
    "how much), a light-grey tick at the foot of each panel marking every point's measured x; the memory axis draws "
    "smaller markers moved at most 1.5 %, as methods at one ratio hold nearly the same bytes (the notes say how "
    "near). The `--vs` reference is marked in the legend. Dashed: full "
    "context; dotted: no context; bars: 95% window-bootstrap intervals (every panel); the legend "
    "gives each variant's windows, † where fewer than 10. A panel whose values span under 0.05 across methods is left "
    "out.",
    PLOTS["distance"]: "## Retention against distance\n\nOne panel per requested ratio that several variants ran "
    "at, drawing the 4 variants with the highest mean retention there (and the `--vs` reference), nudged "
    "sideways within each bucket so bars do not overlap; the notes name every variant left out, for lower retention "
    "or because it was not run at that ratio. Dashed: full context; dotted: no context. Tick labels give each "
    "bucket's questions (n) and windows (win), † where fewer than 10; hollow, unconnected markers: buckets with fewer "
    "than 2 windows or questions, too thin for an interval or a trend (the line joins the neighbouring buckets "
    "directly). Bars: 95% window-bootstrap intervals; the y axis spans the bars and the full- and no-context lines. The "
    "table above holds every variant.",
    PLOTS["loss"]: "## Optimisation loss curves\n\nThe optimiser's loss per step (the recipe's `optim.loss` of the "
    "virtual tokens against their targets, mean over layers), per requested ratio the median over windows (counted "
    "in the title) with the interquartile range shaded, on one y axis shared by every panel; a log axis only where "
    "the losses span more than a decade. Variants with the same loss at every step share a panel; a ratio without a "
    "curve, and curves that coincide (each median within the other's interquartile band), are named on the panel. "
    "Only optimising methods have a curve: the figure names the others.",
    PLOTS["heatmap"]: "## Which facts degrade first\n\nEach question's retention per method variant and requested "
    "ratio, binned (< 0.25, 0.25–0.5, 0.5–0.75, 0.75–0.9, ≥ 0.9) on a five-step cividis scale; white: not run. "
    "Columns: per ratio, the variants the distance figure's rule picks, grouped by ratio; the notes name the variants "
    "left out and those not run at a ratio; full and no context are retention's ends (1, 0) and are not drawn. Rows: "
    "the questions where the columns differ most, as many as fit, ordered by mean retention with each cell clipped to "
    "[0, 1] (the notes give the range and the share of cells outside it; a black dot marks a cell above 1.1, a white "
    "× one below 0, counted in the legend), the first facts to "
    "degrade at the bottom; the title's counts add up to every question asked: those drawn, those left out to fit "
    "and the weak ones (no retention).",
}


def _markdown_plots(images: dict[str, list[str]]) -> list[str]:
    out = []
    for image, notes in images.items():
        out += ["", CAPTIONS[image], "", f"![{image}]({image})", *notes]
    if not images:
        out += ["", "_No plots: install matplotlib (`pip install 'vkv[plots]'`)._"]
    return out


def _markdown_per_transcript(results: SweepResults) -> list[str]:
    transcripts, keys, cells = per_transcript(results)
    out = [
        "",
        "## Per transcript",
        "",
        "Mean retention / recall kept / choice accuracy, each transcript's windows pooled (recall kept — where no "
        "run measured clozes or none counts for recall).",
        "",
    ]
    out += _table_head(["method", "ratio"], transcripts)
    for variant, ratio in keys:
        row = [cells.get((variant, ratio, t)) for t in transcripts]
        out.append(
            f"| {variant} | {'—' if ratio is None else format(ratio, '.1f')} | "
            + " | ".join(
                "—"
                if c is None
                else " / ".join(
                    format_cell(c, key, fmt)
                    for key, fmt in (("mean_retention", ".3f"), ("recall_kept", ".3f"), ("choice_accuracy", ".2f"))
                )
                for c in row
            )
            + " |"
        )
    return out


def _markdown_per_question(results: SweepResults) -> list[str]:
    cols, names, grid = per_question(results)
    out = ["", "## Per question (keyword-correct share)", "", *_table_head(["window / question"], cols)]
    return out + [
        f"| {n} | " + " | ".join("—" if v is None else f"{v:.2f}" for v in vals) + " |" for n, vals in zip(names, grid)
    ]
