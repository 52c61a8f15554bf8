"""`vkv report`'s PNGs, drawn for a reviewer: ticks at the values measured, every axis labelled, error bars named on the
figure (95 % window-bootstrap intervals), every method drawn or named as missing, colour-blind-safe colours (Okabe and
Ito's palette, each method also with its own marker), and a two-colour scale for yes/no data.

Each `draw_*` takes the report's results and table rows and writes one PNG; False when there is nothing to draw.
Needs matplotlib (pip install 'vkv[plots]'); `vkv.sweep.report.plots` checks that it is there.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

REFERENCES = ("full", "none")
FEW_WINDOWS = 10  # intervals resting on fewer windows than this carry a caveat
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
INTERVALS = "error bars: 95 % window-bootstrap intervals"


def style(index: int) -> dict:
    """Colour, marker and line style of the index-th method: 8 colours × 8 markers, then dashed lines."""
    return {
        "color": OKABE_ITO[index % len(OKABE_ITO)],
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": "-" if index < len(OKABE_ITO) else "--",
    }


def measured_ticks(values: list[float], closest: float = 0.12) -> list[float]:
    """Tick positions at the values measured (to 3 significant digits), dropping one of two that sit within
    `closest` of each other on a log axis."""
    out: list[float] = []
    for v in sorted({float(f"{v:.3g}") for v in values if v and v > 0}):
        if not out or math.log(v / out[-1]) > closest:
            out.append(v)
    return out


def set_log_ticks(axis, values: list[float], label) -> None:
    """A log axis ticked at `values` only, each labelled by `label(value)`."""
    import matplotlib.ticker as ticker  # optional dependency (vkv[plots])

    ticks = measured_ticks(values)
    axis.set_major_locator(ticker.FixedLocator(ticks))
    axis.set_major_formatter(ticker.FixedFormatter([label(t) for t in ticks]))
    axis.set_minor_locator(ticker.NullLocator())


def window_label(variant: str, windows: int) -> str:
    """A legend entry: the variant and how many windows its intervals rest on, marked † when fewer than FEW_WINDOWS."""
    mark = "†" if windows < FEW_WINDOWS else ""
    return f"{variant} ({windows} window{'s' if windows != 1 else ''}){mark}"


def _footnote(fig, lines: list[str]) -> None:
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=8, va="bottom", ha="left", wrap=True)


def few_windows_note(windows: list[int]) -> list[str]:
    if any(w < FEW_WINDOWS for w in windows):
        return [f"† intervals from fewer than {FEW_WINDOWS} windows: they understate the uncertainty"]
    return []


QUALITY_PANELS = (  # (y metric, its interval, x metric, title, y label)
    ("keyword_accuracy", None, "ratio_achieved", "keyword accuracy", "share of questions answered (keyword check)"),
    ("choice_accuracy", "choice_ci", "ratio_achieved", "choice accuracy", "share of multiple-choice questions right"),
    ("mean_retention", "retention_ci", "ratio_achieved", "mean retention", "retention (1 = as with full context)"),
    ("mean_retention", "retention_ci", "span_memory_kib", "retention against memory", "retention (1 = full context)"),
)


def draw_quality(table_rows: list[dict], path: Path) -> bool:
    """Quality against the achieved ratio (keyword, choice accuracy, retention) and retention against the span's bytes
    in memory, one colour and marker per method variant, intervals as error bars."""
    import matplotlib.pyplot as plt  # optional dependency (vkv[plots])

    curves = defaultdict(list)
    for row in table_rows:
        if row["method"] not in REFERENCES and row["ratio_achieved"]:
            curves[row["variant"]].append(row)
    if not curves:
        return False
    fig, axes = plt.subplots(1, len(QUALITY_PANELS), figsize=(22, 6.2))
    handles = {}
    for ax, (key, interval, x_key, title, y_label) in zip(axes, QUALITY_PANELS):
        for index, (variant, pts) in enumerate(sorted(curves.items())):
            pts = sorted((p for p in pts if p.get(x_key) and p[key] is not None), key=lambda r: r[x_key])
            if not pts:
                continue
            errors = None
            if interval and all(p.get(interval) for p in pts):
                errors = [[p[key] - p[interval][0] for p in pts], [p[interval][1] - p[key] for p in pts]]
            label = window_label(variant, min(p.get("windows", 0) for p in pts))
            handles[label] = ax.errorbar(
                [p[x_key] for p in pts], [p[key] for p in pts], yerr=errors, capsize=3, label=label, **style(index)
            )
        for ref, line in zip(REFERENCES, ("--", ":")):
            values = [r[key] for r in table_rows if r["method"] == ref and r[key] is not None]
            if values:
                name = "full context" if ref == "full" else "no context"
                handles[name] = ax.axhline(values[0], color="grey", linestyle=line, label=name)
        _quality_axes(ax, [p[x_key] for pts in curves.values() for p in pts if p.get(x_key)], x_key)
        ax.set_title(title)
        ax.set_ylabel(y_label)
        ends = [v for pts in curves.values() for p in pts for v in (p[key], *(p.get(interval) or ())) if v is not None]
        ax.set_ylim(min([0.0, *ends]) - 0.05, max([1.0, *ends]) + 0.05)  # error bars included
        ax.grid(alpha=0.3)
    fig.legend(handles.values(), handles.keys(), loc="lower right", fontsize=8, ncol=2, frameon=False)
    windows = [r.get("windows", 0) for pts in curves.values() for r in pts]
    notes = [f"{INTERVALS} (choice accuracy and retention; keyword accuracy has none)."]
    _footnote(fig, notes + few_windows_note(windows))
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _quality_axes(ax, xs: list[float], x_key: str) -> None:
    ax.set_xscale("log")
    if x_key == "ratio_achieved":
        set_log_ticks(ax.xaxis, xs, lambda x: f"{x:g}×")
        ax.set_xlabel("achieved ratio (span tokens per entry; log scale)")
    else:
        set_log_ticks(ax.xaxis, xs, lambda x: f"{x / 1000:.3g}k" if x >= 1000 else f"{x:.3g}")
        ax.set_xlabel("span KiB in memory per window (decoding cache; log scale)")
    if len(ax.get_xticks()) > 6:
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)


def draw_distance(columns: list[str], cells: dict, table_rows: list[dict], path: Path) -> bool:
    """Retention by distance bucket: one panel per requested ratio, one line per method variant run at it, intervals
    as error bars, one legend for every panel (a variant keeps its colour and marker); the footnote names the
    variants each panel does not draw and why."""
    import matplotlib.pyplot as plt  # optional dependency, as above

    ratios = sorted({ratio for (_, ratio) in cells if ratio})
    if len(columns) < 2 or not ratios:
        return False
    variants = sorted({r["variant"] for r in table_rows if r["method"] not in REFERENCES})
    windows = {(r["variant"], r["ratio_requested"]): r.get("windows", 0) for r in table_rows}
    cols = min(3, len(ratios))
    rows_ = math.ceil(len(ratios) / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(6.5 * cols, 4.6 * rows_ + 1.2), squeeze=False, sharey=True)
    handles, notes = {}, []
    for ax, ratio in zip(axes.flat, ratios):
        missing = []
        for index, variant in enumerate(variants):
            row = cells.get((variant, ratio))
            if row is None:
                run_at = (variant, ratio) in windows
                missing.append(f"{variant} ({'no distances recorded' if run_at else 'not run'})")
                continue
            points = [(i, row[c]) for i, c in enumerate(columns) if c in row]
            errors = [[c.mean - c.low for _, c in points], [c.high - c.mean for _, c in points]]
            xs, ys = [i for i, _ in points], [c.mean for _, c in points]
            drawn = ax.errorbar(xs, ys, yerr=errors, capsize=3, **style(index))
            handles.setdefault(window_label(variant, windows.get((variant, ratio), 0)), drawn)
        ax.set_xticks(range(len(columns)), columns)
        ax.set_xlabel("tokens from a question's latest evidence to the span's end")
        ax.set_ylabel("mean retention of usable questions")
        ax.set_title(f"requested ratio {ratio:g}×")
        ax.grid(alpha=0.3)
        if missing:
            notes.append(f"not drawn at {ratio:g}×: " + "; ".join(missing))
    means = [v for row in cells.values() for c in row.values() for v in (c.low, c.high)]
    axes[0, 0].set_ylim(min([0.0, *means]) - 0.05, max([1.0, *means]) + 0.05)  # shared by every panel
    for ax in list(axes.flat)[len(ratios) :]:
        ax.axis("off")
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=2, fontsize=7)
    lines = [f"{INTERVALS}. Full context (retention 1) and no context (0) are not drawn.", *notes]
    lines += few_windows_note(list(windows.values()))
    _footnote(fig, lines)
    width, height = fig.get_size_inches()
    wrapped = sum(math.ceil(len(line) / (15 * width)) for line in lines)  # about 15 characters an inch at size 8
    top = (0.15 * math.ceil(len(handles) / 2) + 0.2) / height  # the legend's rows, about 0.15 inch each
    fig.tight_layout(rect=(0, (0.15 * wrapped + 0.1) / height, 1, 1 - top), h_pad=2)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def draw_losses(lines: list[dict], path: Path) -> bool:
    """Each method variant's optimisation loss per step, one colour per requested ratio (viridis: colour-blind safe
    and ordered like the ratios)."""
    import matplotlib.pyplot as plt  # optional dependency, as above
    import matplotlib.ticker as ticker

    traced = defaultdict(list)
    for line in lines:
        if len(line["result"].get("loss_trace") or []) > 1:  # meanpool records only its initial loss
            traced[line["variant"]].append(line)
    if not traced:
        return False
    n = len(traced)
    cols = min(3, n)
    fig, axes = plt.subplots(math.ceil(n / cols), cols, figsize=(5 * cols, 3.6 * math.ceil(n / cols)), squeeze=False)
    ratios = sorted({line["result"]["ratio_requested"] for g in traced.values() for line in g})
    colours = {r: plt.cm.viridis(0.85 * i / max(len(ratios) - 1, 1)) for i, r in enumerate(ratios)}
    for ax, (variant, group) in zip(axes.flat, sorted(traced.items())):
        shown = set()
        for line in group:
            ratio = line["result"]["ratio_requested"]
            label = None if ratio in shown else f"{ratio:g}×"
            ax.plot(line["result"]["loss_trace"], color=colours[ratio], alpha=0.7, label=label)
            shown.add(ratio)
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(ticker.LogFormatterSciNotation(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
        ax.set_title(variant, fontsize=9)
        ax.set_xlabel("optimisation step")
        ax.set_ylabel("loss (log scale)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, title="requested ratio", title_fontsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def draw_heatmap(cols: list[str], names: list[str], grid: list[list], path: Path) -> bool:
    """Per question and column, whether the greedy answer passes the keyword check: two colours when every cell is
    yes or no (one run each), a sequential colour-blind-safe scale (cividis) for shares of several runs."""
    import matplotlib.pyplot as plt  # optional dependency, as above
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    if not names:
        return False
    data = np.array([[np.nan if v is None else v for v in row] for row in grid], dtype=float)
    binary = bool(np.isin(data[~np.isnan(data)], (0.0, 1.0)).all())
    fig, ax = plt.subplots(figsize=(max(7, 0.45 * len(cols) + 5), max(3, 0.3 * len(names) + 2.5)))
    ax.set_facecolor("white")
    if binary:
        colours = ("#E8E8E8", OKABE_ITO[0])  # wrong: light grey, right: blue (distinct to every colour vision)
        ax.imshow(np.ma.masked_invalid(data), cmap=ListedColormap(colours), vmin=0, vmax=1, aspect="auto")
        legend = [Patch(color=colours[1], label="passes"), Patch(color=colours[0], label="fails")]
        legend.append(Patch(facecolor="white", edgecolor="grey", label="not run"))
        ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, title="keyword check")
    else:
        image = ax.imshow(np.ma.masked_invalid(data), cmap="cividis", vmin=0, vmax=1, aspect="auto")
        fig.colorbar(image, ax=ax, fraction=0.03, label="share of runs passing the keyword check")
    ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlabel("method and requested ratio")
    ax.set_ylabel("window / question")
    ax.set_title("keyword check per question (facts that degrade first at the bottom)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
