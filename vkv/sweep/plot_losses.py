"""`vkv report`'s loss_curves.png: each optimising method variant's loss per step, one panel per variant.

Variants whose losses are identical at every step of every run (they differ only in settings that act after the
optimisation, such as where the virtual tokens sit) share one panel, titled with every name, and the notes say so;
a ratio a variant has no curve at is named on its panel and in the notes. Shared styles and layout come from
vkv.sweep.plots.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from vkv.sweep.plots import _finish, _grid, full_label_key, named_list, ratio_text, shortened_note, style, wrap_notes


def draw_losses(lines: list[dict], path: Path, names: dict[str, str]) -> list[str] | None:
    """Per panel, per requested ratio, the median loss over windows with the interquartile range shaded (one colour
    and marker per ratio); one y axis shared by every panel, log only where the losses span more than a decade.
    The title counts the windows; the notes name the variants without a loss curve (no optimiser), the panels drawn
    once for several variants, the missing ratios and the curves that coincide."""
    from matplotlib.lines import Line2D  # optional dependency (vkv[plots])

    traced, untraced = defaultdict(list), set()
    for line in lines:
        if len(line["result"].get("loss_trace") or []) > 1:  # meanpool records only its initial loss
            traced[line["variant"]].append(line)
        else:
            untraced.add(line["variant"])
    if not traced:
        return None
    panels = same_losses(traced)
    ratios = sorted({line["result"]["ratio_requested"] for g in traced.values() for line in g})
    styles = {r: style(i) for i, r in enumerate(ratios)}
    ran = {(line["variant"], line["result"]["ratio_requested"]) for line in lines}
    fig, axes = _grid(len(panels), height=3.8, sharey=True)
    gaps: dict[float, list[tuple]] = defaultdict(list)  # ratio: the panels without a curve there
    together: list[tuple[tuple, list[float]]] = []  # (panel, ratios whose curves coincide)
    every = []
    for ax, variants in zip(axes, panels):
        group = traced[variants[0]]
        bands = _loss_panel(ax, group, ratios, styles)
        every += [v for low, _, high in bands.values() for v in (*low, *high)]
        missing = [r for r in ratios if r not in bands]
        for r in missing:
            gaps[r].append(variants)
        same = coinciding(bands)
        if same:
            together.append((variants, same))
        _panel_marks(ax, missing, same)
        ax.set_title(" = ".join(names.get(v, v) for v in variants), fontsize=9)
    _loss_scale(axes, every)
    shared = "; one y axis for every panel" if len(panels) > 1 else ""
    title = f"optimiser loss per step: median and interquartile range (band) over {_runs(traced)}{shared}"
    fig.suptitle(wrap_notes([title], fig.get_figwidth(), size=10), fontsize=10)  # within the figure's width
    notes = _loss_notes(panels, gaps, ran, untraced - set(traced), names) + _coincide_notes(together, names)
    handles = {f"{ratio_text(r)}×": Line2D([], [], **styles[r]) for r in ratios}  # in ratio order
    _finish(fig, path, notes + shortened_note(names, set(traced) | untraced), handles, title="requested ratio")
    return ["", *notes] + full_label_key(names, set(traced) | untraced)


def _runs(traced: dict[str, list[dict]]) -> str:
    """How many windows each curve's median is over: "5 windows", "3–5 windows", or runs where seeds repeat one."""
    counts = defaultdict(set)
    runs = defaultdict(int)
    for variant, group in traced.items():
        for x in group:
            key = (variant, x["result"]["ratio_requested"])
            counts[key].add(x["result"]["transcript"])
            runs[key] += 1
    windows = sorted({len(c) for c in counts.values()})
    text = f"{windows[0]}" if len(windows) == 1 else f"{windows[0]}–{windows[-1]}"
    text += " window" + ("s" if windows[-1] != 1 else "")
    if any(runs[k] != len(counts[k]) for k in counts):
        text += " (the runs of every seed)"
    return text


def _panel_marks(ax, missing: list[float], same: list[float]) -> None:
    """On the panel, top right: the ratios without a curve there and the ratios whose curves coincide."""
    marks = []
    if missing:
        marks.append(f"no curve at {', '.join(ratio_text(r) + '×' for r in missing)}")
    if same:
        marks.append(f"{' and '.join(ratio_text(r) + '×' for r in same)}: curves coincide")
    if marks:
        ax.text(0.98, 0.96, "\n".join(marks), transform=ax.transAxes, ha="right", va="top", fontsize=8,
                color="dimgrey")  # fmt: skip


def coinciding(bands: dict[float, tuple]) -> list[float]:
    """The ratios whose median curve lies, at every step both have, within the other's interquartile band, for
    some other ratio of the panel: curves a reader cannot tell apart, one drawn over the other."""
    same = set()
    for a in bands:
        for b in bands:
            if a < b and _within(bands[a], bands[b]) and _within(bands[b], bands[a]):
                same |= {a, b}
    return sorted(same)


def _within(one: tuple, other: tuple) -> bool:
    steps = min(len(one[1]), len(other[1]))
    median, (low, high) = one[1][:steps], (other[0][:steps], other[2][:steps])
    return bool(np.all((median >= low - 1e-9) & (median <= high + 1e-9)))


def _coincide_notes(together: list[tuple[tuple, list[float]]], names: dict[str, str]) -> list[str]:
    notes = []
    for variants, same in together:
        title = " = ".join(names.get(v, v) for v in variants)
        which = " and ".join(f"{ratio_text(r)}×" for r in same)
        notes.append(
            f"{title}: the {which} curves coincide (each median within the other's interquartile band at every "
            "step), one drawn over the other; their markers alternate steps."
        )
    return notes


def same_losses(traced: dict[str, list[dict]]) -> list[tuple[str, ...]]:
    """The panels: variants (sorted) grouped when their runs cover the same windows, ratios and seeds with the same
    loss at every step, so a figure does not repeat one curve under several names."""
    panels: dict[tuple, list[str]] = defaultdict(list)
    for variant in sorted(traced):
        runs = sorted(
            (
                x["result"]["ratio_requested"],
                x["result"]["transcript"],
                x["seed"],
                tuple(np.round(x["result"]["loss_trace"], 6)),
            )
            for x in traced[variant]
        )
        panels[tuple(runs)].append(variant)
    return sorted(tuple(v) for v in panels.values())


def differing(variants: tuple[str, ...]) -> str:
    """The settings in which variant labels ("method key=value …") differ, with their values: "virtual_offset = -4 / —"."""
    settings = [dict(part.split("=", 1) for part in v.split(" ") if "=" in part) for v in variants]
    keys = sorted({k for s in settings for k in s if len({s.get(k, "—") for s in settings}) > 1})
    return "; ".join(f"{k} = {' / '.join(s.get(k, '—') for s in settings)}" for k in keys) or "the method's name"


def _loss_notes(panels, gaps: dict, ran: set, untraced: set, names: dict[str, str]) -> list[str]:
    """In words: the panels that show several variants and why, the ratios a panel has no curve at and why, and the
    variants without an optimiser."""
    notes = []
    for variants in (p for p in panels if len(p) > 1):
        shown = " and ".join(names.get(v, v) for v in variants)
        notes.append(
            f"{shown} have the same loss at every step of every run (they differ only in {differing(variants)}), "
            "so one panel shows them."
        )
    for ratio, without in sorted(gaps.items()):
        titles = ", ".join(" = ".join(names.get(v, v) for v in p) for p in without)
        untraced_there = any((v, ratio) in ran for p in without for v in p)
        why = "some ran there without a loss trace" if untraced_there else "not run at that ratio"
        notes.append(f"No {ratio_text(ratio)}× curve for {titles}: {why}.")
    if untraced:
        none = ", ".join(named_list(untraced, names))
        notes.append(f"Only optimising methods are drawn; no loss curve (no optimiser): {none}.")
    return notes


def _loss_panel(ax, group: list[dict], ratios: list[float], styles: dict) -> dict[float, tuple]:
    """Draw one panel's median curves and bands, markers staggered across ratios so curves drawn over each other
    still show theirs; returns {ratio: (25th percentile, median, 75th percentile) per step}."""
    bands = {}
    for ratio in ratios:
        traces = [x["result"]["loss_trace"] for x in group if x["result"]["ratio_requested"] == ratio]
        if traces:
            padded = np.full((len(traces), max(map(len, traces))), np.nan)  # runs may stop at different steps
            for row, trace in zip(padded, traces):
                row[: len(trace)] = trace
            bands[ratio] = tuple(np.nanpercentile(padded, (25, 50, 75), axis=0))
    for rank, (ratio, (low, median, high)) in enumerate(bands.items()):
        steps = np.arange(len(median))
        every = max(1, len(steps) // 10) * len(bands)
        ax.fill_between(steps, low, high, color=styles[ratio]["color"], alpha=0.2, linewidth=0)
        ax.plot(steps, median, markevery=(rank * every // len(bands), every), **styles[ratio])
    optim = group[0]["identity"]["config"].get("optim") or {}
    ax.set_ylabel(f"{optim.get('loss', 'the recipe')} loss against the targets\n(mean over layers)")
    ax.set_xlabel("optimisation step")
    ax.tick_params(axis="y", labelleft=True)  # sharey hides them on inner panels
    ax.grid(alpha=0.3, which="both")
    return bands


def _loss_scale(axes, every: list[float]) -> None:
    """The shared y axis: log, labelled so, where the losses of every panel span more than a decade."""
    import matplotlib.ticker as ticker  # optional dependency (vkv[plots])

    if max(every) > 10 * min(every) > 0:
        axes[0].set_yscale("log")  # shared: every panel
        axes[0].yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
        axes[0].yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))  # 0.3, not 3×10⁻¹
        axes[0].yaxis.set_minor_formatter(ticker.NullFormatter())
        for ax in axes:
            ax.set_ylabel(ax.get_ylabel().replace("(mean over layers)", "(mean over layers; log scale)"))
