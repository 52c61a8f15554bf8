"""`vkv report DIR`: tables, plots and report.md from a sweep's results files, and nothing else.

Every number shown is read from DIR/results*.jsonl (merged across shards, each run once); failed runs come
from DIR/errors*.jsonl. Rows are one method variant × requested ratio, pooled over windows, questions and
seeds the way `vkv eval` pools them; a variant is a method plus the options that differ between its runs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from vkv.errors import VkvError
from vkv.evals.intervals import paired_difference, window_bootstrap
from vkv.evals.metrics import mean
from vkv.evals.summary import aggregate, base_transcript
from vkv.io import write_text_atomic
from vkv.settings import setting
from vkv.sweep.plots import FEW_WINDOWS
from vkv.sweep.results import read_results

REFERENCES = ("full", "none")
PLOTS = {
    "quality": "quality_vs_ratio.png",
    "distance": "retention_vs_distance.png",
    "loss": "loss_curves.png",
    "heatmap": "question_heatmap.png",
}


@dataclass
class SweepResults:
    directory: Path
    lines: list[dict]  # one per run: the sweep record with its eval JSON under "result"
    errors: list[dict] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    breakdowns: dict[str, tuple] = field(default_factory=dict, repr=False)  # breakdown()'s by field, computed once


def load(directory: str | Path) -> SweepResults:
    d = Path(directory)
    files = sorted(p.name for p in d.glob("results*.jsonl")) if d.is_dir() else []
    if not files:
        raise VkvError(f"{d}: no results*.jsonl here; run `vkv sweep CONFIG --out {d}` first")
    lines = [line for line in read_results(d) if isinstance(line.get("result"), dict)]
    for line in lines:
        _check_line(line, d)
    if not lines:
        raise VkvError(f"{d}: the results files hold no finished runs yet")
    _label(lines)
    finished = {line["run_id"] for line in lines}
    errors = [e for e in read_results(d, "errors*.jsonl", latest=True) if e.get("run_id") not in finished]
    return SweepResults(d, lines, errors, files)


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


# ---- variants and rows -----------------------------------------------------------------------------------


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
            parts = [method] + [f"{names[k]}={_short(flat.get(k))}" for k in varying]
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
    """{(window, question id): metric} over these runs, seeds averaged; retention only for usable questions."""
    per: dict[tuple[str, str], list[float]] = defaultdict(list)
    for line in lines:
        result = line["result"]
        for q in result["questions"]:
            if metric == "retention" and (q["weak"] or q["retention"] is None):
                continue
            per[(result["transcript"], q["id"])].append(float(q[metric]))
    return {k: sum(v) / len(v) for k, v in per.items()}


def rows(results: SweepResults) -> list[dict[str, Any]]:
    """One row per variant × requested ratio, quality metrics pooled by `aggregate` (as in `vkv eval`), with 95 %
    intervals for retention and choice accuracy from a bootstrap over windows."""
    out = []
    for (variant, _ratio), group in groups(results).items():
        pooled = aggregate([{**g["result"], "method": variant} for g in group], by_transcript=False)[0]
        losses = [g["result"]["optimisation"].get("best_loss") for g in group if g["result"].get("optimisation")]
        retention = window_bootstrap(question_values(group, "retention"))
        choice = window_bootstrap(question_values(group, "choice_correct"))
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
                "compress_seconds": mean(g["result"]["seconds"] for g in group),
                "run_seconds": mean(g["wall_seconds"] for g in group),
                "final_loss": mean(x for x in losses if x is not None),
                "peak_memory_mb": max(g["peak_memory_mb"] for g in group),
                "peak_per_process": all(g.get("peak_memory_kind") == "process-max-rss" for g in group),
            }
        )
    return sorted(out, key=_row_order)


def paired(results: SweepResults, vs: str) -> list[dict[str, Any]]:
    """Every variant's paired difference from the reference `vs` (a variant label, or a method with one variant)
    at the same requested ratio (or the reference's only row, for full/none), on the questions both were scored
    on: retention (usable questions) and choice accuracy, each with its window-bootstrap interval. `LABEL@RATIO`
    takes the reference's row at that ratio for every row (an ablation at another ratio: kvzip@10.667)."""
    grouped = groups(results)
    name, at = _reference_ratio(vs)
    matches = [key for key in grouped if key[0] == name] or [
        key for key in grouped if grouped[key][0]["run"]["method"] == name
    ]
    if len({variant for variant, _ in matches}) != 1:
        known = ", ".join(sorted({v for v, _ in grouped}))
        what = "names no run" if not matches else "matches several variants; name one"
        raise VkvError(f"--vs {vs}: {what} (variants: {known})")
    if at is not None:
        if not any(ratio == at for _, ratio in matches):
            ran = ", ".join(f"{r:g}" for _, r in matches if r is not None) or "none"
            raise VkvError(f"--vs {vs}: {matches[0][0]} has no run at {at:g}x (ratios: {ran})")
        matches = [key for key in matches if key[1] == at]
    references = {ratio: grouped[(variant, ratio)] for variant, ratio in matches}
    out = []
    for (variant, ratio), group in grouped.items():
        reference = references.get(ratio) or (references.get(None) if len(references) == 1 else None)
        if at is not None:  # one reference row for every ratio
            reference = references[at]
        if reference is None or (variant, ratio) in matches or group[0]["run"]["method"] in REFERENCES:
            continue
        diffs = {
            metric: paired_difference(question_values(group, metric), question_values(reference, metric))
            for metric in ("retention", "choice_correct")
        }
        out.append(
            {
                "variant": variant,
                "ratio_requested": ratio,
                "reference": reference[0]["variant"] + ("" if at is None else f" @{at:g}x"),
                "retention": diffs["retention"],
                "choice": diffs["choice_correct"],
            }
        )
    return sorted(out, key=lambda r: (r["ratio_requested"] or 0.0, r["variant"]))


def _reference_ratio(vs: str) -> tuple[str, float | None]:
    """`--vs`'s reference and, after an `@`, the one requested ratio to compare every row with (None: each row's own)."""
    name, sep, ratio = vs.rpartition("@")
    if not sep:
        return vs, None
    try:
        return name, float(ratio)
    except ValueError:
        raise VkvError(f"--vs {vs}: after '@' comes a requested ratio, e.g. kvzip@10.667") from None


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


def splits(results: SweepResults) -> list[str]:
    """The transcript splits (dev/test) the runs were scored on; "unsplit" for transcripts outside them."""
    return sorted({line["result"].get("split") or "unsplit" for line in results.lines})


def _row_order(row: dict) -> tuple:
    ref = REFERENCES.index(row["method"]) if row["method"] in REFERENCES else len(REFERENCES)
    return ref, row["variant"], row["ratio_requested"] or 0.0


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
    ("fidelity KL", "fidelity_kl", ".4f"),
    ("compress s", "compress_seconds", ".1f"),
    ("run s", "run_seconds", ".1f"),
    ("final loss", "final_loss", ".4f"),
    ("peak MB", "peak_memory_mb", ".0f"),
)


MARKDOWN_ONLY = (
    "ratio_stored",
    "run_seconds",
    "final_loss",
)  # left out of the console table, which must fit a terminal


def _cell(row: dict, key: str, fmt: str) -> str:
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


def _row_windows(table_rows: list[dict]) -> list[tuple[str, int]]:
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


PAIRED_COLUMNS = ("method", "ratio", "vs", "questions", "windows", "Δ retention [95% CI]", "Δ choice acc [95% CI]")


def _paired_cells(row: dict) -> list[str]:
    ret = row["retention"]
    return [
        row["variant"],
        "—" if row["ratio_requested"] is None else f"{row['ratio_requested']:.1f}",
        row["reference"],
        str(ret.questions if ret else 0),
        str(ret.windows if ret else 0),
        _difference(ret),
        _difference(row["choice"]),
    ]


def _breakdown_cells(columns: list[str], row: dict[str, Cell]) -> list[str]:
    return [
        f"{row[c].mean:.3f} [{row[c].low:.2f}, {row[c].high:.2f}] ({row[c].questions})" if c in row else "—"
        for c in columns
    ]


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
        column = line["variant"] + (f" {r['ratio_requested']:g}×" if r["ratio_requested"] else "")
        columns[column] = _row_order(
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


# ---- rich tables ------------------------------------------------------------------------------------------


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
        table.add_row(*(_cell(row, key, fmt) for _, key, fmt in columns))
    console.print(table)
    caveat = few_windows(_row_windows(table_rows))
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
            diff.add_row(*_paired_cells(row))
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
                by.add_row(row["variant"], _cell(row, "ratio_requested", ".1f"), *_breakdown_cells(columns, cells[key]))
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


# ---- plots -----------------------------------------------------------------------------------------------


def plots(results: SweepResults, table_rows: list[dict], out: Path) -> dict[str, list[str]]:
    """Write the PNGs that have data (vkv.sweep.plots); returns {file name: report.md lines under it (alias key,
    what was left out)}. Needs matplotlib (pip install 'vkv[plots]')."""
    try:
        import matplotlib  # optional dependency (vkv[plots])

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: F401
    except ImportError:
        return {}
    from vkv.sweep import plots as draw

    out.mkdir(parents=True, exist_ok=True)
    names = draw.aliases(draw.methods(table_rows))  # one alias per long label, the same in every figure
    drawn = {
        "quality": lambda path: draw.draw_quality(table_rows, path, names),
        "distance": lambda path: draw.draw_distance(*breakdown(results, "distance_tokens"), table_rows, path, names),
        "loss": lambda path: draw.draw_losses(results.lines, path, names),
        "heatmap": lambda path: draw.draw_heatmap(*per_question(results), path, names),
    }
    notes = {PLOTS[name]: plot(out / PLOTS[name]) for name, plot in drawn.items()}
    return {image: lines for image, lines in notes.items() if lines is not None}


# ---- report.md -------------------------------------------------------------------------------------------


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
        f"# Sweep report: {', '.join(sorted({line['sweep'] for line in lines}))}",
        "",
        f"{len(lines)} finished runs read from {', '.join(results.files)} in `{results.directory}`; every "
        "number below comes from those files.",
        "",
        f"- transcript split: {', '.join(splits(results))}",
        f"- models: {'; '.join(models)}",
        f"- evaluated windows: {len(units)} ({', '.join(units)})",
        f"- code revisions: {', '.join(revisions)}",
        f"- failed runs: {len(results.errors)}",
    ]


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
        "`achieved`: span tokens per real entry (entries per KV head); `stored`: span tokens per slot its segments "
        "hold (lower when head-wise budgets pad); `in memory`: the span's full K/V bytes over the bytes the decoding "
        "cache holds for its entries (keys, values, biases, per-head offsets), and `span KiB` those bytes per window; "
        "— for runs that did not record them.",
        "",
        "| " + " | ".join(h for h, _, _ in COLUMNS) + " |",
        "|" + "|".join("---" if h == "method" else "---:" for h, _, _ in COLUMNS) + "|",
    ]
    out += ["| " + " | ".join(_cell(r, key, fmt) for _, key, fmt in COLUMNS) + " |" for r in table_rows]
    caveat = few_windows(_row_windows(table_rows))
    return out + (["", f"**{caveat}**"] if caveat else [])


def _markdown_paired(paired_rows: list[dict]) -> list[str]:
    out = [
        "",
        f"## Paired differences from {paired_rows[0]['reference'].split()[0]}",
        "",
        "Method minus reference, question by question on the questions both were scored on, at the same "
        "requested ratio; 95% intervals resample windows. `n.s.`: the interval includes 0 (not separable).",
        "",
        "| " + " | ".join(PAIRED_COLUMNS) + " |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    out += ["| " + " | ".join(_paired_cells(r)) + " |" for r in paired_rows]
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
            f"| {r['variant']} | {_cell(r, 'ratio_requested', '.1f')} | "
            + " | ".join(_breakdown_cells(columns, cells[(r["variant"], r["ratio_requested"])]))
            + " |"
            for r in table_rows
            if (r["variant"], r["ratio_requested"]) in cells
        ]
        windows = [
            (f"{v} {ratio or ''}".strip(), min(c.windows for c in row.values())) for (v, ratio), row in cells.items()
        ]
        caveat = few_windows(windows)
        out += ["", f"**{caveat}**"] if caveat else []
    return out


CAPTIONS = {
    PLOTS["quality"]: "## Quality vs achieved ratio and bytes in memory\n\nOne colour and marker per method variant "
    "(long labels by alias, keyed under the figure), each nudged sideways on the log x axis so points and bars at one "
    "ratio stay apart; ratio ticks at the ratios measured, memory ticks at round MiB. Dashed: full context; dotted: "
    "no context; bars: 95% window-bootstrap intervals (choice accuracy and retention); the legend gives each "
    "variant's windows, † where fewer than 10. A panel whose values span under 0.05 across methods is left out.",
    PLOTS["distance"]: "## Retention against distance\n\nOne panel per requested ratio, every method variant run at it "
    "drawn, nudged sideways so bars do not overlap; a panel names the variants without a point there and why. Tick "
    "labels give each bucket's questions (n); hollow markers: buckets with fewer than 2 windows or questions. Bars: "
    "95% window-bootstrap intervals.",
    PLOTS["loss"]: "## Optimisation loss curves\n\nThe optimiser's loss per step (the recipe's `optim.loss` of the "
    "virtual tokens against their targets, mean over layers), per requested ratio the median over windows with the "
    "interquartile range shaded; a log axis only where the losses span more than a decade. Only optimising methods "
    "have a curve: the figure names the others.",
    PLOTS["heatmap"]: "## Which facts degrade first\n\nWhether the greedy answer passes the keyword check, per "
    "question and column (blue: passes, grey: fails, white: not run; with several runs per cell, their share on a "
    "cividis scale). Questions that fail in every column, full context included, are left out; the rest are "
    "ordered with those the full context answers first (a black line ends them), fewest passing columns at the "
    "bottom. When more rows than fit remain, those where the methods agree most are left out too (counted below).",
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
    out = ["", "## Per transcript", "", "Mean retention / choice accuracy, each transcript's windows pooled.", ""]
    out += _table_head(["method", "ratio"], transcripts)
    for variant, ratio in keys:
        row = [cells.get((variant, ratio, t)) for t in transcripts]
        out.append(
            f"| {variant} | {'—' if ratio is None else format(ratio, '.1f')} | "
            + " | ".join(
                "—" if c is None else f"{_cell(c, 'mean_retention', '.3f')} / {_cell(c, 'choice_accuracy', '.2f')}"
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


# ---- the command ---------------------------------------------------------------------------------------


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
    images = plots(results, table_rows, out)
    if not images:
        console.print("[yellow]no plots: matplotlib is not installed (pip install 'vkv[plots]')[/]")
    write_text_atomic(out / "report.md", markdown(results, table_rows, images, paired_rows))
    console.print(f"wrote {out / 'report.md'}" + (f" and {', '.join(images)}" if images else ""))
    return 0
