"""`vkv report`'s PNGs, drawn for a reviewer: ticks at the values measured, every axis labelled (log axes say so),
error bars named on the figure (95 % window-bootstrap intervals), every method drawn or named as missing (left
out for a stated rule, or not run at a panel's ratio), colour-blind-safe colours (Okabe and Ito's palette; a crowded
figure draws few enough variants, `leading`, that each has its own colour and marker), points on a measured axis
moved sideways only where their markers would overlap (`spread`, in the variants' drawing order, as the distance
panels nudge them), each measured x marked by a light-grey tick on the axis, variants named by their method and the
option that tells them apart (`legend_names`; report.md keys the full labels), the `--vs` reference marked in the legend, ratios as a reader
writes them (10.7×, not 10.667×), legends in a blank grid cell or under the panels, notes under them, a two-colour scale only for yes/no
data, and a caveat under 10 windows.

This module holds what the figures share (styles, ticks, layout, which variants a crowded panel draws) and the
distance figure; the quality figure, the loss curves and the question heatmap have their own modules
(vkv.sweep.plot_quality, vkv.sweep.plot_losses, vkv.sweep.plot_questions). Each `draw_*` writes one PNG and returns the markdown lines
report.md prints under the figure (the full labels of shortened names, what was left out), or None when there is nothing to draw.
Needs matplotlib (pip install 'vkv[plots]'); `vkv.sweep.report.plots` checks that it is there.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from vkv.io import atomic_path

REFERENCES = ("full", "none")
FEW_WINDOWS = 10  # intervals resting on fewer windows than this carry a caveat
# Okabe and Ito's colour-blind-safe palette, yellow last: it is the faintest on white, so it comes only with the
# eighth variant, and its markers get a dark edge (YELLOW_EDGE)
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
YELLOW_EDGE = "#6B6300"  # a dark olive of the same hue: the yellow marker reads on white
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
INTERVALS = "error bars: 95 % window-bootstrap intervals"
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
    absent: dict[float, list[str]] = field(default_factory=dict)  # variants not run at a drawn ratio
    reference: str | None = None
    keep: int = LEADING  # the best `keep` at each ratio are drawn

    def union(self) -> list[str]:
        """Every variant drawn at some ratio, sorted."""
        return sorted({v for group in self.drawn.values() for v in group})

    def named(self) -> set[str]:
        """Every variant the figure draws or its notes name (so report.md keys all their full labels)."""
        groups = (*self.drawn.values(), *self.left_out.values(), *self.absent.values())
        return {v for group in groups for v in group} | {*self.alone.values()}

    def rule(self, names: dict[str, str]) -> str:
        """The rule in words: "the 4 variants with the highest mean retention … and the reference X wherever it ran"."""
        reference = names.get(self.reference, self.reference)
        also = f", and the reference {reference} wherever it ran" if self.reference else ""
        return f"the {self.keep} variants with the highest mean retention there (the results table){also}"

    def notes(self, names: dict[str, str]) -> list[str]:
        """The rule and what it left out, in words, for the figure and report.md: the variants ranked lower at each
        ratio, those not run at a ratio drawn, and the ratios only one variant ran."""
        out = []
        if any(self.left_out.values()):
            out.append(
                f"Drawn at each ratio: {self.rule(names)}. Left out for lower mean retention "
                f"({_per_ratio(self.left_out, names)}); report.md's tables hold every variant."
            )
        if any(self.absent.values()):
            gone = "; ".join(
                f"{', '.join(named_list(vs, names))} at {ratio_text(r)}×" for r, vs in self.absent.items() if vs
            )
            out.append(f"Not run at a ratio, so not drawn there: {gone}.")
        if self.alone:
            which = " and ".join(f"{ratio_text(r)}×" for r in self.alone)
            who = ", ".join(named_list(set(self.alone.values()), names))
            out.append(
                f"Not drawn: {which}, where only {who} ran (nothing to compare it with; see report.md's tables)."
            )
        return out


def named_list(variants, names: dict[str, str]) -> list[str]:
    """The variants by name in natural order (ratio=2 before ratio=10)."""
    return named_order(names.get(v, v) for v in variants)


def _per_ratio(groups: dict[float, list[str]], names: dict[str, str]) -> str:
    """ "at 3.2×: a, b; at 8×: c": the variants of each ratio by name, sorted."""
    return "; ".join(f"at {ratio_text(r)}×: {', '.join(named_list(vs, names))}" for r, vs in groups.items() if vs)


def leading(
    table_rows: list[dict], reference: str | None = None, keep: int | None = None, ran: list[dict] | None = None
) -> Selection:
    """Per requested ratio, the `keep` variants with the highest mean retention (the reference, `vkv report --vs`,
    is drawn too where it ran); a ratio that only one variant ran is left out when other ratios compare several.
    Without `keep`, the largest up to LEADING whose variants, over every ratio, fit the palette's distinct colours.
    `ran` (default `table_rows`): every row of the results table, to name the variants not run at a drawn ratio."""
    by_ratio: dict[float, list[dict]] = defaultdict(list)
    for row in table_rows:
        if row["method"] not in REFERENCES and row["ratio_requested"]:
            by_ratio[row["ratio_requested"]].append(row)
    compared = any(len(group) > 1 for group in by_ratio.values())
    for size in [keep] if keep else range(LEADING, 0, -1):
        picked = Selection(reference=reference, keep=size)
        for ratio in sorted(by_ratio):
            ranked = [r["variant"] for r in sorted(by_ratio[ratio], key=lambda r: -_retention(r))]
            if compared and len(ranked) == 1:
                picked.alone[ratio] = ranked[0]
                continue
            picked.drawn[ratio] = ranked[:size] + [v for v in ranked[size:] if v == reference]
            picked.left_out[ratio] = [v for v in ranked if v not in picked.drawn[ratio]]
        if len(picked.union()) <= len(OKABE_ITO):
            break
    every = [r for r in (table_rows if ran is None else ran) if r["method"] not in REFERENCES]
    for ratio in picked.drawn:
        there = {r["variant"] for r in every if r["ratio_requested"] == ratio}
        picked.absent[ratio] = sorted({r["variant"] for r in every} - there)
    return picked


def _retention(row: dict) -> float:
    value = row.get("mean_retention")
    return -math.inf if value is None else value


def style(index: int) -> dict:
    """Colour, marker and line style of the index-th method. The marker moves one extra step each time the 8
    colours wrap around, so no (colour, marker) pair repeats among the first 64 methods; the line style changes with
    each wrap as a third cue. The figures draw at most 8 variants (`leading`), so those drawn differ in colour."""
    lap = index // len(OKABE_ITO)
    colour = OKABE_ITO[index % len(OKABE_ITO)]
    edge = {"markeredgecolor": YELLOW_EDGE} if colour == "#F0E442" else {}
    return {
        "color": colour,
        "marker": MARKERS[(index + lap) % len(MARKERS)],
        "linestyle": LINESTYLES[lap % len(LINESTYLES)],
        **edge,
    }


def methods(table_rows: list[dict], reference: str | None = None) -> list[str]:
    """The method variants the figures draw, in one order, so a variant keeps its style in every figure: first those
    a crowded panel draws (`leading`), so that they take the first colours and stay apart by colour, then the rest;
    each group sorted."""
    every = {r["variant"] for r in table_rows if r["method"] not in REFERENCES}
    first = set(leading(table_rows, reference).union())
    return sorted(first & every) + sorted(every - first)


def legend_names(variants: list[str]) -> dict[str, str]:
    """{label: name} for the labels a figure names more briefly: a label is its method plus every option in which that
    method's runs differ ("kvzip head_budget=global normalise=context"); its name keeps the method and the fewest of
    its options that no other variant of the method here shares all of (of several such sets, the one whose values the
    fewest other variants share, then the first in the label's order), so a method run once is named by itself and two variants of one method by the option that separates them. Labels
    already that short are not in the dict (`names.get(v, v)` names every variant)."""
    parsed = {v: _label_parts(v) for v in variants}
    by_head: dict[str, list[str]] = defaultdict(list)
    for variant, (head, _) in parsed.items():
        by_head[head].append(variant)
    out: dict[str, str] = {}
    for head, group in by_head.items():
        for variant in group:
            options = parsed[variant][1]
            others = [parsed[u][1] for u in group if u != variant]
            shared = {k: sum(other.get(k) == value for other in others) for k, value in options.items()}
            for size in range(len(options) + 1):
                apart = [c for c in combinations(options, size) if not any(_agree(o, options, c) for o in others)]
                if apart:  # of those, the options the fewest other variants share (the most telling)
                    chosen = min(apart, key=lambda c: sum(shared[k] for k in c))
                    name = " ".join([head] + [f"{k}={options[k]}" for k in chosen])
                    if name != variant:
                        out[variant] = name
                    break
    return out


def _agree(other: dict[str, str], options: dict[str, str], keys) -> bool:
    """Whether `other` has every one of `keys` at the value `options` gives it."""
    return all(other.get(k) == options[k] for k in keys)


def _label_parts(label: str) -> tuple[str, dict[str, str]]:
    """A variant label split into its head (the method, after the model/quant where the results hold several) and its
    options {key: value} in the label's order (a value with spaces keeps them)."""
    head: list[str] = []
    options: dict[str, str] = {}
    key = None
    for word in label.split(" "):
        if "=" in word and not word.startswith("="):
            key, value = word.split("=", 1)
            options[key] = value
        elif key is None:
            head.append(word)
        else:
            options[key] += f" {word}"
    return " ".join(head), options


def full_label_key(names: dict[str, str], used) -> list[str]:
    """report.md's key from the names a figure shows (of the labels in `used`) to the full labels they shorten."""
    key = [f"- `{names[v]}`: {v}" for v in sorted(names) if v in used]
    return ["", "Full labels of the names in this figure:", "", *key] if key else []


def shortened_note(names: dict[str, str], used) -> list[str]:
    """The figure's own sentence saying how its names were shortened, where one of those it shows (of the labels in
    `used`) was, so the PNG reads without report.md."""
    if not any(v in names for v in used):
        return []
    return [
        "Names: the method and the options that tell its variants apart here (options its variants share left "
        "out); report.md gives each full label."
    ]


def named_order(texts) -> list[str]:
    """Texts in natural order (steps=2 before steps=10)."""
    return sorted(texts, key=lambda t: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", t)])


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


NICE = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8)  # × a power of ten: the values an end of the range may be ticked at
END = 1.2  # a tick within this factor of the smallest and the largest value, so the outermost points can be read


def round_ticks(values: list[float]) -> list[float]:
    """A few round ticks within `values`' range (give or take 10 %): 1, 2, 5 × a power of ten, then 1, 2, 3, 5 ×,
    then every 1–9 ×, the first that gives at least 3 (or the last when the range is narrow); then, where no tick
    lies within a factor END of the smallest or the largest value, the NICE value nearest it (13.8 → 15)."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    decades = range(math.floor(math.log10(lo / 1.1)), math.floor(math.log10(hi * 1.1)) + 1)  # as the 10 % margin

    def within(subs) -> list[float]:
        return [float(f"{m * 10.0**k:.12g}") for k in decades for m in subs if lo / 1.1 <= m * 10.0**k <= hi * 1.1]

    for subs in ((1, 2, 5), (1, 2, 3, 5), range(1, 10)):
        ticks = within(subs)
        if len(ticks) >= 3:
            break
    nice = within(NICE)
    for end in (lo, hi):
        if nice and not any(abs(math.log(t / end)) <= math.log(END) for t in ticks):
            ticks.append(min(nice, key=lambda t: abs(math.log(t / end))))
    return sorted(set(ticks)) or [float(f"{lo:.2g}")]


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


def window_label(variant: str, windows: int, reference: bool = False) -> str:
    """A legend entry: the variant (marked as the `--vs` reference where it is) and how many windows its intervals
    rest on, marked † when fewer than FEW_WINDOWS."""
    mark = "†" if windows < FEW_WINDOWS else ""
    role = "reference; " if reference else ""
    return f"{variant} ({role}{windows} window{'s' if windows != 1 else ''}){mark}"


def few_windows_note(windows: list[int]) -> list[str]:
    if any(w < FEW_WINDOWS for w in windows):
        return [f"† intervals from fewer than {FEW_WINDOWS} windows: they understate the uncertainty"]
    return []


def wrap_notes(notes: list[str], width_inch: float, size: float = NOTE_SIZE) -> str:
    """The notes, each wrapped at whole words within the figure's width (about 13 characters an inch at NOTE_SIZE
    points): matplotlib's own wrapping runs lines to the canvas edge, where the saved image's tight box can cut
    them, or widens the image past the figure."""
    chars = max(40, int(width_inch * 72 / (0.6 * size)))
    return "\n".join(textwrap.fill(n, chars, break_long_words=False, break_on_hyphens=False) for n in notes)


def _finish(fig, path: Path, notes: list[str], handles: dict | None = None, title: str | None = None, ncol=3) -> None:
    """Lay the panels out, put the legend in the grid's blank cell where there is one (larger type, no panel
    covered), else under the panels, then the notes under everything, and save with a tight box so nothing is cut
    off."""
    import matplotlib.pyplot as plt  # optional dependency (vkv[plots])

    fig.tight_layout()
    below = 0.0  # figure fraction where the notes start
    blank = [ax for ax in fig.axes if not ax.axison and not ax.get_legend()]
    if handles and blank:
        blank[0].legend(
            handles.values(), handles.keys(), loc="center", ncol=1 if len(handles) <= 12 else 2, fontsize=10,
            frameon=False, title=title, title_fontsize=10,
        )  # fmt: skip
    elif handles:
        legend = fig.legend(
            handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=ncol,
            fontsize=NOTE_SIZE, frameon=False, title=title, title_fontsize=NOTE_SIZE,
        )  # fmt: skip
        fig.canvas.draw()  # the legend's height is known only once drawn
        below = legend.get_window_extent().transformed(fig.transFigure.inverted()).y0
    fig.text(0.01, below - 0.01, wrap_notes(notes, fig.get_figwidth()), fontsize=NOTE_SIZE, va="top", ha="left")
    with atomic_path(path, "image", "--out") as tmp:  # never through a link put where the PNG goes
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)


def draw_distance(
    columns: list[str], cells: dict, table_rows: list[dict], path: Path, names: dict[str, str], reference=None
) -> list[str] | None:
    """Retention by distance bucket: one panel per requested ratio, in it the variants `leading` picks (the best
    few by mean retention there, and the reference), nudged sideways within a bucket's slot (the x axis is buckets,
    not a measure) so error bars at one bucket do not overlap; full context (1) and no context (0) as grey lines;
    hollow, unconnected markers where a bucket holds fewer than 2 windows or questions (no interval to speak of,
    and no trend to draw through: the line joins the neighbouring buckets directly); one legend for every panel. The notes state the rule and name what
    each panel leaves out, and why (lower retention, or not run at that ratio)."""
    picked = leading(
        [r for r in table_rows if (r["variant"], r["ratio_requested"]) in cells], reference, ran=table_rows
    )
    if len(columns) < 2 or not picked.drawn:
        return None
    variants = methods(table_rows, reference)  # the index into every figure's styles
    windows = {(r["variant"], r["ratio_requested"]): r.get("windows", 0) for r in table_rows}
    fig, axes = _grid(len(picked.drawn), sharey=True)
    handles, thin = {}, False
    for ax, (ratio, drawn) in zip(axes, picked.drawn.items()):
        step = min(0.15, 0.7 / len(drawn))  # sideways offset between methods (a marker's width), within a slot
        for rank, variant in enumerate(sorted(drawn, key=variants.index)):  # every figure's order, left to right
            kind = style(variants.index(variant))
            handles[variant], hollow = _distance_line(
                ax, columns, cells[(variant, ratio)], kind, nudge(rank, len(drawn), step)
            )
            thin = thin or hollow
        for value, line in ((1.0, "--"), (0.0, ":")):
            handles["full context" if value else "no context"] = ax.axhline(value, color="grey", linestyle=line)
        _distance_axes(ax, columns, [cells[(v, ratio)] for v in drawn], ratio)
    bounds = [
        v for r, drawn in picked.drawn.items() for x in drawn for c in cells[(x, r)].values() for v in (c.low, c.high)
    ]
    axes[0].set_ylim(min([0.0, *bounds]) - 0.05, max([1.0, *bounds]) + 0.05)  # the drawn bars; shared by every panel
    told = picked.notes(names)
    unrecorded = [(r["variant"], r["ratio_requested"]) for r in table_rows
                  if r["method"] not in REFERENCES and (r["variant"], r["ratio_requested"]) not in cells]  # fmt: skip
    if unrecorded:
        which = ", ".join(column_label(names.get(v, v), ratio) for v, ratio in unrecorded)
        told.append(f"No distances recorded, not drawn: {which}.")
    lines = [f"{INTERVALS}.", *told]
    lines += [f"Hollow markers, not joined: {THIN}."] if thin else []
    lines += few_windows_note([windows[(v, r)] for r, drawn in picked.drawn.items() for v in drawn])
    fewest = {v: min(w for (variant, _), w in windows.items() if variant == v) for v in handles if v in variants}
    legend = {window_label(names.get(v, v), fewest[v], v == reference): handles[v] for v in variants if v in fewest}
    legend.update({k: handles[k] for k in ("full context", "no context")})
    used = picked.named() | {v for v, _ in unrecorded}
    _finish(fig, path, lines + shortened_note(names, used), legend)
    return ([""] + told if told else []) + full_label_key(names, used)


THIN = (
    "buckets with fewer than 2 windows or questions (no real interval, so no trend drawn through them: the line "
    "joins the neighbouring buckets directly)"
)


def _distance_axes(ax, columns: list[str], rows: list[dict], ratio: float) -> None:
    ax.set_xticks(range(len(columns)), [bucket_label(c, [row[c] for row in rows if c in row]) for c in columns],
                  fontsize=8)  # fmt: skip
    ax.tick_params(axis="y", labelleft=True)  # sharey hides them on inner panels
    ax.set_xlabel("tokens from a question's latest evidence to the span's end\n(n: questions; win: windows)")
    ax.set_ylabel("retention (1 = full context)")
    ax.set_title(f"requested ratio {ratio_text(ratio)}×")
    ax.grid(alpha=0.3)


def bucket_label(column: str, drawn: list) -> str:
    """A bucket's tick label: its questions (n) and windows over the drawn variants' cells, † under FEW_WINDOWS."""
    windows = {c.windows for c in drawn}
    mark = "†" if windows and min(windows) < FEW_WINDOWS else ""
    return f"{column}\nn={_span({c.questions for c in drawn})}, {_span(windows)} win{mark}"


def _distance_line(ax, columns: list[str], row: dict, kind: dict, offset: float):
    """One variant's retention per bucket with its intervals: a line between the buckets of at least 2 windows and
    questions, passing over a thinner bucket, whose marker is hollow and unconnected; returns the legend's handle
    and whether any bucket is thin."""
    from matplotlib.lines import Line2D  # optional dependency (vkv[plots])

    points = [(i + offset, row[c]) for i, c in enumerate(columns) if c in row]
    errors = [[c.mean - c.low for _, c in points], [c.high - c.mean for _, c in points]]
    ax.errorbar(
        [x for x, _ in points], [c.mean for _, c in points], yerr=errors, capsize=3, **{**kind, "linestyle": "none"}
    )
    few = [min(c.windows, c.questions) < 2 for _, c in points]
    real = [point for point, f in zip(points, few) if not f]  # a thin bucket's mean is no trend to follow
    for (x0, a), (x1, b) in zip(real, real[1:]):
        ax.plot([x0, x1], [a.mean, b.mean], color=kind["color"], linestyle=kind["linestyle"], zorder=1.5)
    hollow = [(x, c.mean) for (x, c), f in zip(points, few) if f]
    if hollow:
        ax.plot(*zip(*hollow), linestyle="none", marker=kind["marker"], color=kind["color"], markerfacecolor="white",
                markeredgecolor=kind.get("markeredgecolor", kind["color"]), zorder=3)  # above errorbar's markers  # fmt: skip
    return Line2D([], [], **kind), bool(hollow)


def _span(values: set) -> str:
    return "0" if not values else f"{min(values)}" if len(values) == 1 else f"{min(values)}–{max(values)}"
