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
    in memory, one colour and marker per method variant, intervals as error bars; a panel whose values hardly vary
    across methods is left out and named in report.md."""
    import matplotlib.pyplot as plt  # optional dependency (vkv[plots])

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
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 5), squeeze=False)
    handles = {}
    for ax, (key, interval, x_key, title, y_label) in zip(axes.flat, panels):
        for index, variant in enumerate(variants):
            pts = sorted((p for p in curves[variant] if p.get(x_key) and p[key] is not None), key=lambda r: r[x_key])
            if not pts:
                continue
            errors = None
            if interval and all(p.get(interval) for p in pts):
                errors = [[p[key] - p[interval][0] for p in pts], [p[interval][1] - p[key] for p in pts]]
            label = window_label(names.get(variant, variant), min(p.get("windows", 0) for p in pts))
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
    which = "choice accuracy and retention; keyword accuracy has none" if panels[0][1] is None else "every panel"
    flat = f"Not drawn: {'; '.join(dropped)}; a spread under {FLAT} cannot tell the methods apart."
    notes = [f"{INTERVALS} ({which}).", *([flat] if dropped else [])]
    _finish(fig, path, notes + few_windows_note([r.get("windows", 0) for pts in curves.values() for r in pts]), handles)
    return (["", flat] if dropped else []) + alias_key(names, variants)


def _quality_axes(ax, xs: list[float], x_key: str) -> None:
    ax.set_xscale("log")
    if x_key == "ratio_achieved":
        set_log_ticks(ax.xaxis, xs, lambda x: f"{x:g}×")
        ax.set_xlabel("achieved ratio (span tokens per entry; log scale)")
    else:
        set_log_ticks(ax.xaxis, xs, lambda x: f"{x / 1024:.3g}")  # KiB recorded, MiB shown
        ax.set_xlabel("span MiB in memory per window (decoding cache; log scale)")
    if len(ax.get_xticks()) > 6:
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)


def draw_distance(columns: list[str], cells: dict, table_rows: list[dict], path: Path, names: dict[str, str]):
    """Retention by distance bucket: one panel per requested ratio, one line per method variant run at it (nudged
    sideways so error bars at one bucket do not overlap), intervals as error bars, hollow markers where a bucket holds
    fewer than 2 windows or questions (no interval to speak of), one legend for every panel; the notes name the
    variants each panel does not draw and why."""
    import matplotlib.pyplot as plt  # optional dependency, as above

    ratios = sorted({ratio for (_, ratio) in cells if ratio})
    if len(columns) < 2 or not ratios:
        return None
    variants = methods(table_rows)
    windows = {(r["variant"], r["ratio_requested"]): r.get("windows", 0) for r in table_rows}
    step = min(0.08, 0.6 / len(variants))  # sideways offset between methods, within a bucket's slot
    cols = min(3, len(ratios))
    fig, axes = plt.subplots(
        math.ceil(len(ratios) / cols), cols, figsize=(6.5 * cols, 4.6 * math.ceil(len(ratios) / cols)),
        squeeze=False, sharey=True,
    )  # fmt: skip
    handles, notes, thin = {}, [], False
    for ax, ratio in zip(axes.flat, ratios):
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
            xs = [i + (index - (len(variants) - 1) / 2) * step for i, _ in points]
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
    axes[0, 0].set_ylim(min([0.0, *bounds]) - 0.05, max([1.0, *bounds]) + 0.05)  # shared by every panel
    for ax in list(axes.flat)[len(ratios) :]:
        ax.axis("off")
    lines = [f"{INTERVALS}. Full context (retention 1) and no context (0) are not drawn."]
    lines += ["Hollow markers: buckets with fewer than 2 windows or questions (no real interval)."] if thin else []
    lines += [*notes, *few_windows_note(list(windows.values()))]
    fewest = {v: min(w for (variant, _), w in windows.items() if variant == v) for v in handles}  # across panels
    _finish(fig, path, lines, {window_label(names.get(v, v), fewest[v]): handles[v] for v in variants if v in handles})
    return alias_key(names, variants)


def _span(values: set) -> str:
    return "0" if not values else f"{min(values)}" if len(values) == 1 else f"{min(values)}–{max(values)}"


def draw_losses(lines: list[dict], path: Path, names: dict[str, str]) -> list[str] | None:
    """Each method variant's optimisation loss per step, one line per window's run, one colour per requested ratio
    (viridis: colour-blind safe and ordered like the ratios)."""
    import matplotlib.pyplot as plt  # optional dependency, as above
    import matplotlib.ticker as ticker
    from matplotlib.lines import Line2D

    traced = defaultdict(list)
    for line in lines:
        if len(line["result"].get("loss_trace") or []) > 1:  # meanpool records only its initial loss
            traced[line["variant"]].append(line)
    if not traced:
        return None
    n = len(traced)
    cols = min(3, n)
    fig, axes = plt.subplots(math.ceil(n / cols), cols, figsize=(5 * cols, 3.8 * math.ceil(n / cols)), squeeze=False)
    ratios = sorted({line["result"]["ratio_requested"] for g in traced.values() for line in g})
    colours = {r: plt.cm.viridis(0.85 * i / max(len(ratios) - 1, 1)) for i, r in enumerate(ratios)}
    for ax, (variant, group) in zip(axes.flat, sorted(traced.items())):
        for line in group:
            ax.plot(line["result"]["loss_trace"], color=colours[line["result"]["ratio_requested"]], alpha=0.7)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))  # 0.3, not 3×10⁻¹
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_title(names.get(variant, variant), fontsize=9)
        ax.set_xlabel("optimisation step")
        optim = group[0]["identity"]["config"].get("optim") or {}
        ax.set_ylabel(f"{optim.get('loss', '')} loss (log scale)".strip())
        ax.grid(alpha=0.3, which="both")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("optimiser loss per step: each line is one window's run (no error bars)", fontsize=10)
    handles = {f"{r:g}×": Line2D([], [], color=colours[r]) for r in ratios}  # in ratio order
    _finish(fig, path, [], handles, title="requested ratio")
    return alias_key(names, traced)


def draw_heatmap(cols: list[str], questions: list[str], grid: list[list], path: Path, names: dict[str, str]):
    """Per question and column, whether the greedy answer passes the keyword check: two colours when every cell is
    yes or no (one run each), a sequential colour-blind-safe scale (cividis) for shares of several runs. Questions
    that fail in every column say nothing about which facts degrade first: they are counted, not drawn."""
    import matplotlib.pyplot as plt  # optional dependency, as above
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    keep = [i for i, row in enumerate(grid) if any(v for v in row if v is not None)]
    if not keep:
        return None
    dropped = len(questions) - len(keep)
    data = np.array([[np.nan if v is None else v for v in grid[i]] for i in keep], dtype=float)
    binary = bool(np.isin(data[~np.isnan(data)], (0.0, 1.0)).all())
    fig, ax = plt.subplots(figsize=(max(7, 0.35 * len(cols) + 4), max(3, 0.3 * len(keep) + 2)))
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
    ax.set_xticks(range(len(cols)), [_short_column(c, names) for c in cols], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(keep)), [questions[i] for i in keep], fontsize=7)
    ax.set_xlabel("method and requested ratio")
    ax.set_ylabel("window / question")
    ax.set_title(
        f"keyword check of the {len(keep)} questions that pass in some column (those full context passes on top, "
        f"fewest passes at the bottom)\n{dropped} questions that fail in every column are not shown; no error bars "
        "(a cell is one run, or the share of several)",
        fontsize=9,
    )
    _finish(fig, path, [])
    md = ["", f"{dropped} of {len(questions)} questions fail the keyword check in every column and are not drawn."]
    return md + alias_key(names, {c.rpartition(" ")[0] for c in cols} | set(cols))


def _short_column(column: str, names: dict[str, str]) -> str:
    """A heatmap column ("VARIANT 3.2×") with the variant's alias."""
    variant, _, ratio = column.rpartition(" ")
    return f"{names[variant]} {ratio}" if ratio.endswith("×") and variant in names else names.get(column, column)
