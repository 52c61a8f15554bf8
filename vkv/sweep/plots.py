"""`vkv report`'s PNGs, drawn for a reviewer: ticks at the values measured, every axis labelled (log axes say so),
error bars named on the figure (95 % window-bootstrap intervals), every method drawn or named as missing,
colour-blind-safe colours (Okabe and Ito's palette, each method with its own colour and marker pair), short aliases
for long method labels (keyed in report.md), legends and notes under the panels, and a two-colour scale for yes/no
data.

Each `draw_*` takes the report's results, table rows and aliases and writes one PNG; it returns the markdown lines
report.md prints under the figure (the alias key, what was left out), or None when there is nothing to draw.
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
LINESTYLES = ("-", "--", ":", "-.")
INTERVALS = "error bars: 95 % window-bootstrap intervals"
LONG_LABEL = 28  # longer labels crowd legends and ticks: the figures use an alias, report.md gives the full label
FLAT = 0.05  # a quality panel whose values span less than this across methods cannot tell them apart
ROW_INCH, FRAME_INCH, MAX_HEIGHT = 0.18, 2.5, 14.0  # the question heatmap: per row, title and labels, at most
MAX_ROWS = int((MAX_HEIGHT - FRAME_INCH) / ROW_INCH)  # questions that fit


def style(index: int) -> dict:
    """Colour, marker and line style of the index-th method. The marker moves one extra step each time the 8
    colours wrap around, so no (colour, marker) pair repeats among the first 64 methods; the line style changes with
    each wrap as a third cue."""
    lap = index // len(OKABE_ITO)
    return {
        "color": OKABE_ITO[index % len(OKABE_ITO)],
        "marker": MARKERS[(index + lap) % len(MARKERS)],
        "linestyle": LINESTYLES[lap % len(LINESTYLES)],
    }


def methods(table_rows: list[dict]) -> list[str]:
    """The method variants the figures draw, in one order, so a variant keeps its style in every figure."""
    return sorted({r["variant"] for r in table_rows if r["method"] not in REFERENCES})


def aliases(variants: list[str]) -> dict[str, str]:
    """{label: alias} for labels longer than LONG_LABEL: the method and a number per long variant ("vkv-2")."""
    out: dict[str, str] = {}
    count: dict[str, int] = defaultdict(int)
    for variant in sorted(variants):
        if len(variant) > LONG_LABEL:
            method = variant.split(" ")[0]
            count[method] += 1
            out[variant] = f"{method}-{count[method]}"
    return out


def alias_key(names: dict[str, str], used) -> list[str]:
    """report.md's key from the aliases a figure shows (of the labels in `used`) to the full labels."""
    key = [f"- `{names[v]}`: {v}" for v in sorted(names) if v in used]
    return ["", "Labels in this figure:", "", *key] if key else []


def measured_ticks(values: list[float], closest: float = 0.12) -> list[float]:
    """Tick positions at the values measured (to 3 significant digits), dropping one of two that sit within
    `closest` of each other on a log axis."""
    out: list[float] = []
    for v in sorted({float(f"{v:.3g}") for v in values if v and v > 0}):
        if not out or math.log(v / out[-1]) > closest:
            out.append(v)
    return out


def set_log_ticks(axis, ticks: list[float], label) -> None:
    """A log axis ticked at `ticks` only, each labelled by `label(value)`."""
    import matplotlib.ticker as ticker  # optional dependency (vkv[plots])

    axis.set_major_locator(ticker.FixedLocator(ticks))
    axis.set_major_formatter(ticker.FixedFormatter([label(t) for t in ticks]))
    axis.set_minor_locator(ticker.NullLocator())


def nudge(index: int, count: int, step: float) -> float:
    """The sideways offset of the index-th of `count` methods, centred on 0, so points at one x do not overlap."""
    return (index - (count - 1) / 2) * step


def round_ticks(values: list[float]) -> list[float]:
    """A few round ticks within `values`' range (give or take 10 %, the points' nudge): 1, 2, 5 × a power of ten, then 1, 2, 3, 5 ×, then every 1–9 ×,
    the first that gives at least 3 (or the last, or the smallest value rounded, when the range is narrow)."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    decades = range(math.floor(math.log10(lo)), math.floor(math.log10(hi)) + 1)
    for subs in ((1, 2, 5), (1, 2, 3, 5), range(1, 10)):
        ticks = [m * 10.0**k for k in decades for m in subs if lo / 1.1 <= m * 10.0**k <= hi * 1.1]
        if len(ticks) >= 3:
            break
    return ticks or [float(f"{lo:.2g}")]


def _grid(count: int, width: float = 6.0, height: float = 4.6, **shared):
    """A figure of `count` panels in a grid of at most 2 columns (within a page's 12 inches, text readable); the
    unused cells are blank. Returns (fig, the axes of the panels)."""
    import matplotlib.pyplot as plt  # optional dependency (vkv[plots])

    cols = min(2, count)
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, **shared)
    for ax in axes.flat[count:]:
        ax.axis("off")
    return fig, list(axes.flat[:count])


def window_label(variant: str, windows: int) -> str:
    """A legend entry: the variant and how many windows its intervals rest on, marked † when fewer than FEW_WINDOWS."""
    mark = "†" if windows < FEW_WINDOWS else ""
    return f"{variant} ({windows} window{'s' if windows != 1 else ''}){mark}"


def few_windows_note(windows: list[int]) -> list[str]:
    if any(w < FEW_WINDOWS for w in windows):
        return [f"† intervals from fewer than {FEW_WINDOWS} windows: they understate the uncertainty"]
    return []


def _finish(fig, path: Path, notes: list[str], handles: dict | None = None, title: str | None = None) -> None:
    """Lay the panels out, put the legend and then the notes under them (outside the panels, so neither covers an
    axis label), and save with a tight box so nothing is cut off."""
    import matplotlib.pyplot as plt  # optional dependency (vkv[plots])

    fig.tight_layout()
    below = 0.0  # figure fraction where the notes start
    if handles:
        legend = fig.legend(
            handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=3,
            fontsize=8, frameon=False, title=title, title_fontsize=8,
        )  # fmt: skip
        fig.canvas.draw()  # the legend's height is known only once drawn
        below = legend.get_window_extent().transformed(fig.transFigure.inverted()).y0
    fig.text(0.01, below - 0.01, "\n".join(notes), fontsize=9, va="top", ha="left", wrap=True)
    fig.savefig(path, dpi=120, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)


QUALITY_PANELS = (  # (y metric, its interval, x metric, title, y label)
    ("keyword_accuracy", None, "ratio_achieved", "keyword accuracy", "share of questions answered (keyword check)"),
    ("choice_accuracy", "choice_ci", "ratio_achieved", "choice accuracy", "share of multiple-choice questions right"),
    ("mean_retention", "retention_ci", "ratio_achieved", "mean retention", "retention (1 = full context)"),
    ("mean_retention", "retention_ci", "span_memory_kib", "retention against memory", "retention (1 = full context)"),
)


def draw_quality(table_rows: list[dict], path: Path, names: dict[str, str]) -> list[str] | None:
    """Quality against the achieved ratio (keyword, choice accuracy, retention) and retention against the span's bytes
    in memory, one colour and marker per method variant (nudged sideways on the log x axis so points and intervals
    at one x stay apart), intervals as error bars, at most 2 panels a row; a panel whose values hardly vary across
    methods is left out and named in report.md."""
    variants = methods(table_rows)
    curves = {v: [r for r in table_rows if r["variant"] == v and r["ratio_achieved"]] for v in variants}
    if not any(curves.values()):
        return None
    panels, dropped = [], []
    for panel in QUALITY_PANELS:
        values = [p[panel[0]] for pts in curves.values() for p in pts if p[panel[0]] is not None]
        if values and max(values) - min(values) > FLAT:
            panels.append(panel)
        elif panel[3] not in dropped:
            spread = f"between {min(values):.3f} and {max(values):.3f}" if values else "not recorded"
            dropped.append(f"{panel[3]} (every method {spread})")
    if not panels:
        return None
    fig, axes = _grid(len(panels))
    handles = {}
    step = min(0.025, 0.25 / len(variants))  # log-x units: the spread of a ratio's points stays under ±0.13
    for ax, (key, interval, x_key, title, y_label) in zip(axes, panels):
        for index, variant in enumerate(variants):
            pts = sorted((p for p in curves[variant] if p.get(x_key) and p[key] is not None), key=lambda r: r[x_key])
            if not pts:
                continue
            errors = None
            if interval and all(p.get(interval) for p in pts):
                errors = [[p[key] - p[interval][0] for p in pts], [p[interval][1] - p[key] for p in pts]]
            label = window_label(names.get(variant, variant), min(p.get("windows", 0) for p in pts))
            xs = [p[x_key] * math.exp(nudge(index, len(variants), step)) for p in pts]
            handles[label] = ax.errorbar(xs, [p[key] for p in pts], yerr=errors, capsize=3, label=label, **style(index))
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
    which = "choice accuracy and retention; keyword accuracy has none" if panels[0][1] is None else "every panel"
    flat = f"Not drawn: {'; '.join(dropped)}; a spread under {FLAT} cannot tell the methods apart."
    notes = [f"{INTERVALS} ({which}).", *([flat] if dropped else [])]
    _finish(fig, path, notes + few_windows_note([r.get("windows", 0) for pts in curves.values() for r in pts]), handles)
    return (["", flat] if dropped else []) + alias_key(names, variants)


def _quality_axes(ax, xs: list[float], x_key: str) -> None:
    ax.set_xscale("log")
    if x_key == "ratio_achieved":  # every method's ratios measured: few distinct ones
        set_log_ticks(ax.xaxis, measured_ticks(xs), lambda x: f"{x:g}×")
        ax.set_xlabel("achieved ratio (span tokens per entry; log scale)")
    else:  # bytes differ by method at one ratio: round MiB (KiB recorded) rather than some methods' values
        set_log_ticks(ax.xaxis, [t * 1024 for t in round_ticks([x / 1024 for x in xs])], lambda x: f"{x / 1024:g}")
        ax.set_xlabel("span MiB in memory per window (decoding cache; log scale)")
    if len(ax.get_xticks()) > 6:
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)


def draw_distance(columns: list[str], cells: dict, table_rows: list[dict], path: Path, names: dict[str, str]):
    """Retention by distance bucket: one panel per requested ratio, one line per method variant run at it (nudged
    sideways so error bars at one bucket do not overlap), intervals as error bars, hollow markers where a bucket holds
    fewer than 2 windows or questions (no interval to speak of), one legend for every panel; the notes name the
    variants each panel does not draw and why."""
    ratios = sorted({ratio for (_, ratio) in cells if ratio})
    if len(columns) < 2 or not ratios:
        return None
    variants = methods(table_rows)
    windows = {(r["variant"], r["ratio_requested"]): r.get("windows", 0) for r in table_rows}
    step = min(0.08, 0.6 / len(variants))  # sideways offset between methods, within a bucket's slot
    fig, axes = _grid(len(ratios), sharey=True)
    handles, notes, thin = {}, [], False
    for ax, ratio in zip(axes, ratios):
        missing, counts = [], defaultdict(set)
        for index, variant in enumerate(variants):
            row = cells.get((variant, ratio))
            short = names.get(variant, variant)
            if row is None:
                missing.append(f"{short} ({'no distances recorded' if (variant, ratio) in windows else 'not run'})")
                continue
            points = [(i, row[c]) for i, c in enumerate(columns) if c in row]
            for i, c in points:
                counts[i].add(c.questions)
            xs = [i + nudge(index, len(variants), step) for i, _ in points]
            errors = [[c.mean - c.low for _, c in points], [c.high - c.mean for _, c in points]]
            drawn = ax.errorbar(xs, [c.mean for _, c in points], yerr=errors, capsize=3, **style(index))
            handles.setdefault(variant, drawn)
            few = [(x, c.mean) for x, (_, c) in zip(xs, points) if min(c.windows, c.questions) < 2]
            if few:
                thin = True
                ax.plot(*zip(*few), linestyle="none", marker=style(index)["marker"], color=style(index)["color"],
                        markerfacecolor="white", zorder=3)  # above errorbar's own (filled) markers  # fmt: skip
        ticks = [f"{c}\nn={_span(counts[i])}" for i, c in enumerate(columns)]
        ax.set_xticks(range(len(columns)), ticks, fontsize=8)
        ax.tick_params(axis="y", labelleft=True)  # sharey hides them on inner panels
        ax.set_xlabel("tokens from a question's latest evidence to the span's end (n: questions)")
        ax.set_ylabel("retention (1 = full context)")
        ax.set_title(f"requested ratio {ratio:g}×")
        ax.grid(alpha=0.3)
        if missing:
            notes.append(f"not drawn at {ratio:g}×: " + "; ".join(missing))
    bounds = [v for row in cells.values() for c in row.values() for v in (c.low, c.high)]
    axes[0].set_ylim(min([0.0, *bounds]) - 0.05, max([1.0, *bounds]) + 0.05)  # shared by every panel
    lines = [f"{INTERVALS}. Full context (retention 1) and no context (0) are not drawn."]
    lines += ["Hollow markers: buckets with fewer than 2 windows or questions (no real interval)."] if thin else []
    lines += [*notes, *few_windows_note(list(windows.values()))]
    fewest = {v: min(w for (variant, _), w in windows.items() if variant == v) for v in handles}  # across panels
    _finish(fig, path, lines, {window_label(names.get(v, v), fewest[v]): handles[v] for v in variants if v in handles})
    return alias_key(names, variants)


def _span(values: set) -> str:
    return "0" if not values else f"{min(values)}" if len(values) == 1 else f"{min(values)}–{max(values)}"


def draw_losses(lines: list[dict], path: Path, names: dict[str, str]) -> list[str] | None:
    """Each optimising method variant's loss per step: per requested ratio, the median over windows with the
    interquartile range shaded (one colour and marker per ratio); a log y axis only where the losses span more than a
    decade. The notes name the variants without a loss curve (no optimiser)."""
    import matplotlib.ticker as ticker  # optional dependency, as above
    from matplotlib.lines import Line2D

    traced, untraced = defaultdict(list), set()
    for line in lines:
        if len(line["result"].get("loss_trace") or []) > 1:  # meanpool records only its initial loss
            traced[line["variant"]].append(line)
        else:
            untraced.add(line["variant"])
    if not traced:
        return None
    fig, axes = _grid(len(traced), height=3.8)
    ratios = sorted({line["result"]["ratio_requested"] for g in traced.values() for line in g})
    styles = {r: style(i) for i, r in enumerate(ratios)}
    for ax, (variant, group) in zip(axes, sorted(traced.items())):
        every = []
        for ratio in ratios:
            traces = [x["result"]["loss_trace"] for x in group if x["result"]["ratio_requested"] == ratio]
            if not traces:
                continue
            padded = np.full((len(traces), max(map(len, traces))), np.nan)  # runs may stop at different steps
            for row, trace in zip(padded, traces):
                row[: len(trace)] = trace
            low, median, high = np.nanpercentile(padded, (25, 50, 75), axis=0)
            steps = np.arange(len(median))
            ax.fill_between(steps, low, high, color=styles[ratio]["color"], alpha=0.2, linewidth=0)
            ax.plot(steps, median, markevery=max(1, len(steps) // 10), **styles[ratio])
            every += [*low, *high]
        optim = group[0]["identity"]["config"].get("optim") or {}
        scale = ""
        if max(every) > 10 * min(every) > 0:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))  # 0.3, not 3×10⁻¹
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())
            scale = "; log scale"
        ax.set_ylabel(f"{optim.get('loss', 'the recipe')} loss against the targets\n(mean over layers{scale})")
        ax.set_title(names.get(variant, variant), fontsize=9)
        ax.set_xlabel("optimisation step")
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("optimiser loss per step: median over windows, band: interquartile range", fontsize=10)
    none = ", ".join(sorted(names.get(v, v) for v in untraced - set(traced)))
    notes = [f"Only optimising methods are drawn; no loss curve (no optimiser): {none}."] if none else []
    handles = {f"{r:g}×": Line2D([], [], **styles[r]) for r in ratios}  # in ratio order
    _finish(fig, path, notes, handles, title="requested ratio")
    return alias_key(names, set(traced) | untraced)


def draw_heatmap(cols: list[str], questions: list[str], grid: list[list], path: Path, names: dict[str, str]):
    """Per question and column, whether the greedy answer passes the keyword check: two colours when every cell is
    yes or no (one run each), a sequential colour-blind-safe scale (cividis) for shares of several runs; thin white
    cell borders, a line between the questions the full context passes and those it fails. Questions that fail in
    every column say nothing about which facts degrade first: they are counted, not drawn; beyond MAX_ROWS, the
    questions where the methods agree most are left out too (and counted)."""
    import matplotlib.pyplot as plt  # optional dependency, as above
    import matplotlib.transforms as transforms
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    keep = [i for i, row in enumerate(grid) if any(v for v in row if v is not None)]
    if not keep:
        return None
    dropped = len(questions) - len(keep)
    methods_at = [j for j, c in enumerate(cols) if c not in REFERENCES]

    def agreement(i: int) -> float:  # the smaller of the passing and failing shares among the methods' cells
        values = [grid[i][j] for j in methods_at if grid[i][j] is not None]
        return -min(sum(values), len(values) - sum(values))

    crowded = set(sorted(keep, key=agreement)[MAX_ROWS:])  # sorted() is stable: ties keep the earlier rows
    keep = [i for i in keep if i not in crowded]
    data = np.array([[np.nan if v is None else v for v in grid[i]] for i in keep], dtype=float)
    binary = bool(np.isin(data[~np.isnan(data)], (0.0, 1.0)).all())
    fig, ax = plt.subplots(figsize=(max(7, 0.35 * len(cols) + 4), max(3, FRAME_INCH + ROW_INCH * len(keep))))
    ax.set_facecolor("white")
    cells = {"edgecolors": "white", "linewidth": 0.3, "vmin": 0, "vmax": 1}
    handles = None
    if binary:
        colours = ("#A0A0A0", OKABE_ITO[0])  # fails: mid grey (apart from white "not run"), passes: blue
        ax.pcolormesh(np.ma.masked_invalid(data), cmap=ListedColormap(colours), **cells)
        handles = {"passes": Patch(color=colours[1]), "fails": Patch(color=colours[0])}
        handles["not run"] = Patch(facecolor="white", edgecolor="grey")
    else:
        mesh = ax.pcolormesh(np.ma.masked_invalid(data), cmap="cividis", **cells)
        fig.colorbar(mesh, ax=ax, fraction=0.03, label="share of runs passing the keyword check")
    ax.set_xlim(0, len(cols))
    ax.set_ylim(len(keep), 0)  # first question on top
    ax.set_xticks(np.arange(len(cols)) + 0.5, [_short_column(c, names) for c in cols], rotation=60, ha="right",
                  fontsize=8)  # fmt: skip
    ax.set_yticks(np.arange(len(keep)) + 0.5, [questions[i] for i in keep], fontsize=7)
    if "full" in cols:  # rows come ordered with those the full context passes on top
        passes = sum((grid[i][cols.index("full")] or 0) >= 0.5 for i in keep)
        if 0 < passes < len(keep):
            ax.axhline(passes, color="black", linewidth=1.5)
            beside = transforms.blended_transform_factory(ax.transAxes, ax.transData)
            for text, va in (("▲ full context passes", "bottom"), ("▼ full context fails", "top")):
                ax.text(1.01, passes, text, transform=beside, va=va, fontsize=8)
    ax.set_xlabel("method and requested ratio")
    ax.set_ylabel("window / question")
    left_out = f"{dropped} questions that fail in every column are not shown"
    if crowded:
        left_out += f", nor {len(crowded)} where the methods agree most (figure height)"
    ax.set_title(
        f"keyword check of {len(keep)} questions (those full context passes on top, fewest passes at the bottom)\n"
        f"{left_out}; no error bars (a cell is one run, or the share of several)",
        fontsize=9,
    )
    _finish(fig, path, [], handles, title="keyword check")
    md = ["", f"{dropped} of {len(questions)} questions fail the keyword check in every column and are not drawn."]
    if crowded:
        md[-1] += f" To keep the figure readable, {len(crowded)} more, where the methods agree most, are left out."
    return md + alias_key(names, {c.rpartition(" ")[0] for c in cols} | set(cols))


def _short_column(column: str, names: dict[str, str]) -> str:
    """A heatmap column ("VARIANT 3.2×") with the variant's alias."""
    variant, _, ratio = column.rpartition(" ")
    return f"{names[variant]} {ratio}" if ratio.endswith("×") and variant in names else names.get(column, column)
