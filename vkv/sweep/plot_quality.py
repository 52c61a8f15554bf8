"""`vkv report`'s quality figure: keyword, choice accuracy and retention against the achieved ratio, and retention
against the span's bytes in memory. Points closer than a marker's width on a panel are spread sideways in the
variants' drawing order (the distance figure's), each point's measured x marked by a light-grey tick at the foot of
its panel; the memory axis, where methods at one ratio hold nearly the same bytes, draws smaller markers and spreads
them less than MEMORY_MOST. Shared styles and layout come from `vkv.sweep.plots`."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from vkv.sweep.plots import (
    FLAT,
    INTERVALS,
    REFERENCES,
    Selection,
    _finish,
    _grid,
    few_windows_note,
    full_label_key,
    leading,
    measured_ticks,
    methods,
    named_list,
    nudge,
    round_ticks,
    set_log_ticks,
    shortened_note,
    style,
    window_label,
)

QUALITY_PANELS = (  # (y metric, its interval, x metric, title, y label)
    (
        "keyword_accuracy",
        "keyword_ci",
        "ratio_achieved",
        "keyword accuracy",
        "share of questions answered (keyword check)",
    ),
    ("choice_accuracy", "choice_ci", "ratio_achieved", "choice accuracy", "share of multiple-choice questions right"),
    ("mean_retention", "retention_ci", "ratio_achieved", "mean retention", "retention (1 = full context)"),
    ("mean_retention", "retention_ci", "span_memory_kib", "retention against memory", "retention (1 = full context)"),
)
MARKER_PT, AXIS_PT = 11.0, 360.0  # a marker and its caps with some air, and a panel's plotting width, in points
MEMORY = "span_memory_kib"
MEMORY_MARKER = {"markersize": 4.0, "capsize": 2}  # smaller on the memory axis, where close bytes are the rule
MEMORY_MOST = math.log(1.015)  # the memory axis moves a point at most 1.5 %: more would invent a difference
MEASURED = "#BBBBBB"  # light grey: the ticks at the measured x, apart from every series colour
MEASURED_GID = "measured x"


def spread(xs: list[float], gap: float) -> list[float]:
    """Sideways offsets (log-x units) that set points `gap` apart where their measured log x lie closer: points are
    grouped into runs, each closer than `gap` to the next (runs whose spread points would come closer than `gap`
    merge); a run is spaced evenly in list order (the variants' drawing order) about the midpoint of its measured
    ends, no wider than it needs; points further apart stay at their measured x."""

    def place(run: list[int]) -> dict[int, float]:
        lo, hi = min(xs[i] for i in run), max(xs[i] for i in run)
        step = max(gap, (hi - lo) / (len(run) - 1)) if len(run) > 1 else 0.0
        return {i: (lo + hi) / 2 + nudge(j, len(run), step) for j, i in enumerate(sorted(run))}

    runs = [[i] for i in sorted(range(len(xs)), key=lambda i: (xs[i], i))]
    merged = True
    while merged:  # runs only merge, so this settles
        merged, out = False, [runs[0]] if runs else []
        for run in runs[1:]:
            if min(place(run).values()) - max(place(out[-1]).values()) < gap * 0.999:
                out[-1], merged = out[-1] + run, True
            else:
                out.append(run)
        runs = out
    at = {i: x for run in runs for i, x in place(run).items()}
    return [at[i] - xs[i] for i in range(len(xs))]


def marker_gap(xs: list[float], x_key: str, marker_pt: float = MARKER_PT) -> float:
    """The log-x distance of a marker's width (`marker_pt`) on a quality panel whose points lie at `xs`: the ratio
    axes take matplotlib's 5 % margins, the memory axis its round ticks and 8 % beyond them."""
    if x_key == "ratio_achieved":
        span = 1.1 * math.log(max(xs) / min(xs))
    else:
        ends = xs + _memory_ticks(xs)
        span = math.log(max(ends) / min(ends)) + 2 * math.log(1.08)
    return marker_pt / AXIS_PT * max(span, 0.5)


def draw_quality(table_rows: list[dict], path: Path, names: dict[str, str], reference=None) -> list[str] | None:
    """Quality against the achieved ratio (keyword, choice accuracy, retention) and retention against the span's bytes
    in memory, for the variants `leading` draws at some ratio (the distance figure's rule; each in its own colour and
    marker, the rest named; the reference marked in the legend), intervals as error bars, at most 2 panels a row.
    Points closer than a marker's width on a panel are spread sideways (`spread`), the memory axis's by at most
    MEMORY_MOST; a light-grey tick at the foot of each panel marks every point's measured x. A panel whose values
    hardly vary across methods is left out and named; report.md keys the full labels of shortened names."""
    picked = leading(table_rows, reference)
    variants = methods(table_rows, reference)  # the index into every figure's styles
    drawn = [v for v in variants if v in picked.union()]
    curves = {v: [r for r in table_rows if r["variant"] == v and r["ratio_achieved"]] for v in drawn}
    if not any(curves.values()):
        return None
    panels, dropped = _quality_panels(curves)
    if not panels:
        return None
    fig, axes = _grid(len(panels))
    handles: dict = {}
    moved: dict[str, tuple[float, float]] = {}  # x metric: (its widest marker gap, the largest offset)
    for ax, panel in zip(axes, panels):
        offsets, gap = _offsets(curves, drawn, panel)
        was = moved.get(panel[2], (0.0, 0.0))
        moved[panel[2]] = (max(was[0], gap), max([was[1], *map(abs, offsets.values())]))
        for variant in drawn:
            kind = style(variants.index(variant))
            handles.update(_quality_curve(ax, curves[variant], panel, offsets, kind, names, variant == reference))
        for ref, line in zip(REFERENCES, ("--", ":")):
            values = [r[panel[0]] for r in table_rows if r["method"] == ref and r[panel[0]] is not None]
            if values:
                name = "full context" if ref == "full" else "no context"
                handles[name] = ax.axhline(values[0], color="grey", linestyle=line, label=name)
        xs = [p[panel[2]] for pts in curves.values() for p in pts if p.get(panel[2]) and p[panel[0]] is not None]
        _measured_marks(ax, xs)
        _quality_axes(ax, [p[panel[2]] for pts in curves.values() for p in pts if p.get(panel[2])], panel[2])
        ax.set_title(panel[3])
        ax.set_ylabel(panel[4])
        ends = [v for pts in curves.values() for p in pts for v in (p[panel[0]], *(p.get(panel[1]) or ()))
                if v is not None]  # fmt: skip
        ax.set_ylim(min([0.0, *ends]) - 0.05, max([1.0, *ends]) + 0.05)  # error bars included
        ax.grid(alpha=0.3)
    rest = [v for v in variants if v not in drawn]
    notes, md = _quality_notes(panels, dropped, picked, rest, moved, names)
    notes += _memory_note(curves, moved.get(MEMORY, (0.0, 0.0))[1]) if any(p[2] == MEMORY for p in panels) else []
    notes += few_windows_note([r.get("windows", 0) for pts in curves.values() for r in pts])
    if any(p[0] == "mean_retention" for p in panels) and any(
        (r.get("mean_retention") or 0) > 1 for pts in curves.values() for r in pts
    ):
        notes.append(ABOVE_ONE)
    _finish(fig, path, notes + shortened_note(names, variants), handles)
    return md + full_label_key(names, variants)


def _offsets(curves: dict[str, list[dict]], drawn: list[str], panel: tuple) -> tuple[dict[int, float], float]:
    """{id(point): its sideways offset in log-x units} on one panel (`spread`, in drawing order), and the gap kept
    between markers; on the memory axis the smaller markers' gap, every offset scaled within MEMORY_MOST."""
    key, _, x_key = panel[:3]
    points = [p for v in drawn for p in curves[v] if p.get(x_key) and p[key] is not None]
    if not points:
        return {}, 0.0
    xs = [p[x_key] for p in points]
    gap = marker_gap(xs, x_key, MARKER_PT * MEMORY_MARKER["markersize"] / 6 if x_key == MEMORY else MARKER_PT)
    offsets = spread([math.log(x) for x in xs], gap)
    most = max(map(abs, offsets), default=0.0)
    if x_key == MEMORY and most > MEMORY_MOST:
        gap, offsets = gap * MEMORY_MOST / most, [o * MEMORY_MOST / most for o in offsets]
    return {id(p): o for p, o in zip(points, offsets)}, gap


def _measured_marks(ax, xs: list[float]) -> None:
    """A light-grey tick rising from the foot of the panel at each measured x (no line to the point drawn)."""
    if xs:
        ax.plot(sorted(set(xs)), [0.018] * len(set(xs)), transform=ax.get_xaxis_transform(), linestyle="none",
                marker="|", markersize=8, markeredgewidth=1.2, color=MEASURED, gid=MEASURED_GID, zorder=1)  # fmt: skip


ABOVE_ONE = "Mean retention above 1: the compressed context gave the correct choice more probability than the full one."
X_NAMES = {"ratio_achieved": "its achieved ratio", MEMORY: "its bytes in memory"}


def _quality_panels(curves: dict[str, list[dict]]) -> tuple[list[tuple], list[str]]:
    """The QUALITY_PANELS whose values vary across the drawn methods by more than FLAT, and the others in words."""
    panels, dropped = [], []
    for panel in QUALITY_PANELS:
        values = [p[panel[0]] for pts in curves.values() for p in pts if p[panel[0]] is not None and p.get(panel[2])]
        if not any(p.get(panel[2]) for pts in curves.values() for p in pts):
            dropped.append(f"{panel[3]} (no run recorded {X_NAMES[panel[2]]})")
        elif values and max(values) - min(values) > FLAT:
            panels.append(panel)
        elif panel[3] not in dropped:
            between = f"between {min(values):.3f} and {max(values):.3f}" if values else "not recorded"
            dropped.append(f"{panel[3]} (every compressed variant {between})")
    return panels, dropped


def _quality_curve(ax, points: list[dict], panel: tuple, offsets: dict, kind: dict, names, reference: bool) -> dict:
    """One variant's points in one quality panel, each `offsets[id(point)]` log units sideways, smaller on the memory
    axis; returns {legend label: handle}."""
    key, interval, x_key = panel[:3]
    pts = sorted((p for p in points if p.get(x_key) and p[key] is not None), key=lambda r: r[x_key])
    if not pts:
        return {}
    errors = None
    if interval and all(p.get(interval) for p in pts):
        errors = [[p[key] - p[interval][0] for p in pts], [p[interval][1] - p[key] for p in pts]]
    variant = pts[0]["variant"]
    label = window_label(names.get(variant, variant), min(p.get("windows", 0) for p in pts), reference)
    xs = [p[x_key] * math.exp(offsets.get(id(p), 0.0)) for p in pts]
    size = MEMORY_MARKER if x_key == MEMORY else {"capsize": 3}
    handle = ax.errorbar(xs, [p[key] for p in pts], yerr=errors, label=label, **size, **kind)
    return {label: handle}


AXIS_NAMES = {"ratio_achieved": "ratio axes", MEMORY: "memory axis"}


def _quality_notes(panels, dropped, picked: Selection, rest: list[str], moved: dict, names) -> tuple[list, list]:
    """The figure's notes and report.md's lines under it: intervals, the sideways spread, the drawing rule with the
    variants it left out, the flat panels."""
    notes = [f"{INTERVALS} (every panel)."]
    spread_at = {k: v for k, v in moved.items() if v[1] > 0 and k != MEMORY}  # the memory axis: `_memory_note`
    if spread_at:
        most = ", ".join(f"±{math.exp(o) - 1:.1%} on the {AXIS_NAMES[k]}" for k, (_, o) in spread_at.items())
        notes.append(
            "Sideways spread: points closer than a marker's width are spread apart in the legend's order, about "
            f"their midpoint and only as far as the markers need (at most {most}). Light-grey ticks at the foot "
            "of each panel mark the measured x of every point; no line joins a point to its tick."
        )
    told = []
    if rest:
        told.append(
            f"Drawn: every variant that is, at some requested ratio, among {picked.rule(names)} (the distance "
            f"figure's rule), so each has its own colour. Left out: "
            f"{', '.join(named_list(rest, names))}; report.md's tables hold every variant."
        )
    if dropped:
        told.append(f"Not drawn: {'; '.join(dropped)}; a spread under {FLAT} cannot tell the methods apart.")
    return notes + told, ([""] + told if told else [])


def same_memory(curves: dict[str, list[dict]]) -> float:
    """The largest relative difference in bytes between drawn methods at one requested ratio (0.008: within 0.8 %)."""
    by_ratio: dict[float, list[float]] = defaultdict(list)
    for pts in curves.values():
        for p in pts:
            if p.get(MEMORY):
                by_ratio[p["ratio_requested"]].append(p[MEMORY])
    return max((max(v) / min(v) - 1 for v in by_ratio.values() if len(v) > 1), default=0.0)


def _memory_note(curves: dict[str, list[dict]], most: float) -> list[str]:
    """The memory panel's note: its smaller markers, how far they moved (`most`, log units) and how close the
    methods at one ratio are in bytes, so that overlapping markers there read as the same memory."""
    return [
        f"Memory axis: smaller markers, moved at most ±{math.exp(most) - 1:.1%} (the grey ticks mark the "
        f"measured bytes); methods at one requested ratio hold the same memory within {same_memory(curves):.1%} "
        "(measured), so their markers overlapping there is honest."
    ]


def _memory_ticks(xs: list[float]) -> list[float]:
    """The memory axis's ticks (KiB recorded) at round MiB."""
    return [t * 1024 for t in round_ticks([x / 1024 for x in xs])]


def _quality_axes(ax, xs: list[float], x_key: str) -> None:
    ax.set_xscale("log")
    if x_key == "ratio_achieved":  # every method's ratios measured: few distinct ones
        set_log_ticks(ax.xaxis, measured_ticks(xs), lambda x: f"{x:g}×")
        ax.set_xlabel("achieved ratio (span tokens per entry; log scale)")
    else:  # bytes differ by method at one ratio: round MiB (KiB recorded) rather than some methods' values
        ticks = _memory_ticks(xs)
        set_log_ticks(ax.xaxis, ticks, lambda x: f"{x / 1024:g}")
        ax.set_xlim(min(xs + ticks) / 1.08, max(xs + ticks) * 1.08)  # every tick shown, the points inside
        ax.set_xlabel("span MiB in memory per window (decoding cache; log scale)")
    if len(ax.get_xticks()) > 6:
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
