"""`vkv report`'s loss_curves.png: each optimising method variant's loss per step, one panel per variant.

Variants whose losses are identical at every step of every run (they differ only in settings that act after the
optimisation, such as where the virtual tokens sit) share one panel, titled with every alias, and the notes say so;
a ratio a variant has no curve at is named on its panel and in the notes. Shared styles and layout come from
vkv.sweep.plots.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from vkv.sweep.plots import _finish, _grid, alias_key, ratio_text, style


def draw_losses(lines: list[dict], path: Path, names: dict[str, str]) -> list[str] | None:
    """Per panel, per requested ratio, the median loss over windows with the interquartile range shaded (one colour
    and marker per ratio); a log y axis only where the losses span more than a decade. The notes name the variants
    without a loss curve (no optimiser), the panels drawn once for several variants, and the missing ratios."""
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
    fig, axes = _grid(len(panels), height=3.8)
    gaps: dict[float, list[tuple]] = defaultdict(list)  # ratio: the panels without a curve there
    for ax, variants in zip(axes, panels):
        group = traced[variants[0]]
        _loss_panel(ax, group, ratios, styles)
        title = " = ".join(names.get(v, v) for v in variants)
        missing = [r for r in ratios if not any(x["result"]["ratio_requested"] == r for x in group)]
        for r in missing:
            gaps[r].append(variants)
        if missing:
            ax.text(0.98, 0.96, f"no curve at {', '.join(ratio_text(r) + '×' for r in missing)}",
                    transform=ax.transAxes, ha="right", va="top", fontsize=8, color="dimgrey")  # fmt: skip
        ax.set_title(title, fontsize=9)
    fig.suptitle("optimiser loss per step: median over windows, band: interquartile range", fontsize=10)
    notes = _loss_notes(panels, gaps, ran, untraced - set(traced), names)
    handles = {f"{ratio_text(r)}×": Line2D([], [], **styles[r]) for r in ratios}  # in ratio order
    _finish(fig, path, notes, handles, title="requested ratio")
    return ["", *notes] + alias_key(names, set(traced) | untraced)


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
        none = ", ".join(sorted(names.get(v, v) for v in untraced))
        notes.append(f"Only optimising methods are drawn; no loss curve (no optimiser): {none}.")
    return notes


def _loss_panel(ax, group: list[dict], ratios: list[float], styles: dict) -> None:
    import matplotlib.ticker as ticker  # optional dependency (vkv[plots])

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
    ax.set_xlabel("optimisation step")
    ax.grid(alpha=0.3, which="both")
