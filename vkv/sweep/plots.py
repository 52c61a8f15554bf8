"""`vkv report`'s PNGs, drawn for a reviewer: ticks at the values measured, every axis labelled (log axes say so),
error bars named on the figure (95 % window-bootstrap intervals), every method drawn or named as missing,
colour-blind-safe colours (Okabe and Ito's palette, each method with its own colour and marker pair), short aliases
for long method labels (keyed in report.md), ratios as a reader writes them (10.7×, not 10.667×), legends and notes
under the panels, a two-colour scale only for yes/no data, and a stated rule wherever a crowded figure leaves
something out.

This module holds what the figures share (styles, ticks, layout, which variants a crowded panel draws) and the
quality and distance figures; the loss curves and the question heatmap have their own modules
(vkv.sweep.plot_losses, vkv.sweep.plot_questions). Each `draw_*` writes one PNG and returns the markdown lines
report.md prints under the figure (the alias key, what was left out), or None when there is nothing to draw.
Needs matplotlib (pip install 'vkv[plots]'); `vkv.sweep.report.plots` checks that it is there.
"""

from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REFERENCES = ("full", "none")
FEW_WINDOWS = 10  # intervals resting on fewer windows than this carry a caveat
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
INTERVALS = "error bars: 95 % window-bootstrap intervals"
LONG_LABEL = 28  # longer labels crowd legends and ticks: the figures use an alias, report.md gives the full label
FLAT = 0.05  # a quality panel whose values span less than this across methods cannot tell them apart
LEADING = 4  # variants a panel draws at one ratio (the best by mean retention); more lines tangle past reading
NOTE_SIZE = 9  # points, the notes under a figure


def ratio_text(ratio: float) -> str:
    """A requested ratio as a reader reads it: 3 significant digits (10.667 → "10.7", 3.2 → "3.2", 16 → "16")."""
    text = f"{ratio:.3g}"
    return text if "e" not in text else f"{ratio:.0f}"


def column_label(variant: str, ratio: float | None) -> str:
    """A variant at a requested ratio, as one column or row name ("kvzip 10.7×"); references have no ratio."""
    return variant if ratio is None else f"{variant} {ratio_text(ratio)}×"


@dataclass
class Selection:
    """Which variants a crowded figure draws at each requested ratio, and what it leaves out, so the notes can say."""

    drawn: dict[float, list[str]] = field(default_factory=dict)  # best mean retention first, the reference last
    left_out: dict[float, list[str]] = field(default_factory=dict)  # run there, lower mean retention than the drawn
    alone: dict[float, str] = field(default_factory=dict)  # ratios only one variant ran: nothing to compare there
    reference: str | None = None

    def named(self) -> set[str]:
        """Every variant the figure draws or its notes name (so report.md keys all their aliases)."""
        return {v for group in (*self.drawn.values(), *self.left_out.values()) for v in group} | {*self.alone.values()}

    def notes(self, names: dict[str, str]) -> list[str]:
        """The rule and what it left out, in words, for the figure and report.md."""
        out = []
        if any(self.left_out.values()):
            reference = names.get(self.reference, self.reference)
            also = f", and the reference {reference} wherever it ran" if self.reference else ""
            cut = "; ".join(
                f"at {ratio_text(r)}×: {', '.join(sorted(names.get(v, v) for v in vs))}"
                for r, vs in self.left_out.items()
                if vs
            )
            out.append(
                f"Drawn at each ratio: the {LEADING} variants with the highest mean retention there (the results "
                f"table){also}. Left out for lower mean retention ({cut}); report.md's tables hold every variant."
            )
        if self.alone:
            which = " and ".join(f"{ratio_text(r)}×" for r in self.alone)
            who = ", ".join(sorted({names.get(v, v) for v in self.alone.values()}))
            out.append(
                f"Not drawn: {which}, where only {who} ran (nothing to compare it with; see report.md's tables)."
            )
        return out


def leading(table_rows: list[dict], reference: str | None = None, keep: int = LEADING) -> Selection:
    """Per requested ratio, the `keep` variants with the highest mean retention (the reference, `vkv report --vs`,
    is drawn too where it ran); a ratio that only one variant ran is left out when other ratios compare several."""
    by_ratio: dict[float, list[dict]] = defaultdict(list)
    for row in table_rows:
        if row["method"] not in REFERENCES and row["ratio_requested"]:
            by_ratio[row["ratio_requested"]].append(row)
    picked = Selection(reference=reference)
    compared = any(len(group) > 1 for group in by_ratio.values())
    for ratio in sorted(by_ratio):
        ranked = [r["variant"] for r in sorted(by_ratio[ratio], key=lambda r: -(r.get("mean_retention") or -math.inf))]
        if compared and len(ranked) == 1:
            picked.alone[ratio] = ranked[0]
            continue
        drawn = ranked[:keep] + [v for v in ranked[keep:] if v == reference]
        picked.drawn[ratio] = drawn
        picked.left_out[ratio] = [v for v in ranked if v not in drawn]
    return picked


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


def methods(table_rows: list[dict], reference: str | None = None) -> list[str]:
    """The method variants the figures draw, in one order, so a variant keeps its style in every figure: first those
    a crowded panel draws (`leading`), so that they take the first colours and stay apart by colour, then the rest;
    each group sorted."""
    every = {r["variant"] for r in table_rows if r["method"] not in REFERENCES}
    first = {v for drawn in leading(table_rows, reference).drawn.values() for v in drawn}
    return sorted(first & every) + sorted(every - first)


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
    decades = range(math.floor(math.log10(lo / 1.1)), math.floor(math.log10(hi * 1.1)) + 1)  # as the 10 % margin
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


def wrap_notes(notes: list[str], width_inch: float) -> str:
    """The notes, each wrapped at whole words within the figure's width (about 13 characters an inch at NOTE_SIZE):
    matplotlib's own wrapping runs lines to the canvas edge, where the saved image's tight box can cut them."""
    chars = max(40, int(width_inch * 72 / (0.6 * NOTE_SIZE)))
    return "\n".join(textwrap.fill(n, chars, break_long_words=False, break_on_hyphens=False) for n in notes)


def _finish(fig, path: Path, notes: list[str], handles: dict | None = None, title: str | None = None, ncol=3) -> None:
    """Lay the panels out, put the legend and then the notes under them (outside the panels, so neither covers an
    axis label), and save with a tight box so nothing is cut off."""
    import matplotlib.pyplot as plt  # optional dependency (vkv[plots])

    fig.tight_layout()
    below = 0.0  # figure fraction where the notes start
    if handles:
        legend = fig.legend(
            handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=ncol,
            fontsize=8, frameon=False, title=title, title_fontsize=8,
        )  # fmt: skip
        fig.canvas.draw()  # the legend's height is known only once drawn
        below = legend.get_window_extent().transformed(fig.transFigure.inverted()).y0
    fig.text(0.01, below - 0.01, wrap_notes(notes, fig.get_figwidth()), fontsize=NOTE_SIZE, va="top", ha="left")
    fig.savefig(path, dpi=120, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)


QUALITY_PANELS = (  # (y metric, its interval, x metric, title, y label)
    ("keyword_accuracy", None, "ratio_achieved", "keyword accuracy", "share of questions answered (keyword check)"),
    ("choice_accuracy", "choice_ci", "ratio_achieved", "choice accuracy", "share of multiple-choice questions right"),
    ("mean_retention", "retention_ci", "ratio_achieved", "mean retention", "retention (1 = full context)"),
    ("mean_retention", "retention_ci", "span_memory_kib", "retention against memory", "retention (1 = full context)"),
)


def draw_quality(table_rows: list[dict], path: Path, names: dict[str, str], reference=None) -> list[str] | None:
    """Quality against the achieved ratio (keyword, choice accuracy, retention) and retention against the span's bytes
    in memory, one colour and marker per method variant (nudged sideways on the log x axis so points and intervals
    at one x stay apart), intervals as error bars, at most 2 panels a row; a panel whose values hardly vary across
    methods is left out and named in report.md. `reference` (`vkv report --vs`) only orders the styles, as in the
    figures that draw a few variants."""
    variants = methods(table_rows, reference)
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


def draw_distance(
    columns: list[str], cells: dict, table_rows: list[dict], path: Path, names: dict[str, str], reference=None
) -> list[str] | None:
    """Retention by distance bucket: one panel per requested ratio, in it the variants `leading` picks (the best
    few by mean retention there, and the reference), nudged sideways so error bars at one bucket do not overlap;
    full context (1) and no context (0) as grey lines; hollow markers where a bucket holds fewer than 2 windows or
    questions (no interval to speak of); one legend for every panel. The notes state the rule and name what each
    panel leaves out, and why."""
    picked = leading([r for r in table_rows if (r["variant"], r["ratio_requested"]) in cells], reference)
    if len(columns) < 2 or not picked.drawn:
        return None
    variants = methods(table_rows, reference)  # the index into every figure's styles
    windows = {(r["variant"], r["ratio_requested"]): r.get("windows", 0) for r in table_rows}
    fig, axes = _grid(len(picked.drawn), sharey=True)
    handles, thin = {}, False
    for ax, (ratio, drawn) in zip(axes, picked.drawn.items()):
        step = min(0.08, 0.6 / len(drawn))  # sideways offset between methods, within a bucket's slot
        for rank, variant in enumerate(drawn):
            kind = style(variants.index(variant))
            handles[variant], hollow = _distance_line(
                ax, columns, cells[(variant, ratio)], kind, nudge(rank, len(drawn), step)
            )
            thin = thin or hollow
        for value, line in ((1.0, "--"), (0.0, ":")):
            handles["full context" if value else "no context"] = ax.axhline(value, color="grey", linestyle=line)
        counts = {c: {cells[(v, ratio)][c].questions for v in drawn if c in cells[(v, ratio)]} for c in columns}
        ax.set_xticks(range(len(columns)), [f"{c}\nn={_span(counts[c])}" for c in columns], fontsize=8)
        ax.tick_params(axis="y", labelleft=True)  # sharey hides them on inner panels
        ax.set_xlabel("tokens from a question's latest evidence to the span's end (n: questions)")
        ax.set_ylabel("retention (1 = full context)")
        ax.set_title(f"requested ratio {ratio_text(ratio)}×")
        ax.grid(alpha=0.3)
    bounds = [v for key, row in cells.items() if key[1] in picked.drawn for c in row.values() for v in (c.low, c.high)]
    axes[0].set_ylim(min([0.0, *bounds]) - 0.05, max([1.0, *bounds]) + 0.05)  # shared by every panel
    told = picked.notes(names)
    unrecorded = [(r["variant"], r["ratio_requested"]) for r in table_rows
                  if r["method"] not in REFERENCES and (r["variant"], r["ratio_requested"]) not in cells]  # fmt: skip
    if unrecorded:
        which = ", ".join(column_label(names.get(v, v), ratio) for v, ratio in unrecorded)
        told.append(f"No distances recorded, not drawn: {which}.")
    lines = [f"{INTERVALS}.", *told]
    lines += ["Hollow markers: buckets with fewer than 2 windows or questions (no real interval)."] if thin else []
    lines += few_windows_note([windows[(v, r)] for r, drawn in picked.drawn.items() for v in drawn])
    fewest = {v: min(w for (variant, _), w in windows.items() if variant == v) for v in handles if v in variants}
    legend = {window_label(names.get(v, v), fewest[v]): handles[v] for v in variants if v in fewest}
    legend.update({k: handles[k] for k in ("full context", "no context")})
    _finish(fig, path, lines, legend)
    return ([""] + told if told else []) + alias_key(names, picked.named() | {v for v, _ in unrecorded})


def _distance_line(ax, columns: list[str], row: dict, kind: dict, offset: float):
    """One variant's retention per bucket with its intervals, hollow where a bucket rests on fewer than 2 windows or
    questions; returns the drawn line and whether any marker is hollow."""
    points = [(i + offset, row[c]) for i, c in enumerate(columns) if c in row]
    errors = [[c.mean - c.low for _, c in points], [c.high - c.mean for _, c in points]]
    drawn = ax.errorbar([x for x, _ in points], [c.mean for _, c in points], yerr=errors, capsize=3, **kind)
    few = [(x, c.mean) for x, c in points if min(c.windows, c.questions) < 2]
    if few:
        ax.plot(*zip(*few), linestyle="none", marker=kind["marker"], color=kind["color"], markerfacecolor="white",
                zorder=3)  # above errorbar's own (filled) markers  # fmt: skip
    return drawn, bool(few)


def _span(values: set) -> str:
    return "0" if not values else f"{min(values)}" if len(values) == 1 else f"{min(values)}–{max(values)}"
