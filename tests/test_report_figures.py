"""The report figures' marks and keys: measured x as grey ticks (no connectors), a tight memory-axis spread with
its note, one left-to-right order in every figure, the reference marked, variants named by method and option."""

from __future__ import annotations

import math

import pytest

from tests.report_helpers import _cell, _markers, _texts, keep_figures, line

LONG = "vkv a_setting_with_a_long_name="  # a long label, named as it is
SHARED = "vkv pooling=uniform steps="  # two options in the label, one of which tells the variants apart


@pytest.fixture
def figures(monkeypatch):
    return keep_figures(monkeypatch)


def _table(rows):
    return [
        {"method": v.split(" ")[0], "variant": v, "ratio_requested": r, "ratio_achieved": r, "span_memory_kib": kib,
         "keyword_accuracy": kw, "choice_accuracy": ret, "mean_retention": ret, "windows": 12,
         "keyword_ci": (kw - 0.1, kw + 0.1), "retention_ci": (ret - 0.05, ret + 0.05)}
        for v, r, kib, ret, kw in rows
    ]  # fmt: skip


def test_a_run_of_close_points_is_spread_in_list_order_not_by_measured_x():
    from vkv.sweep.plot_quality import spread

    gap = 0.05
    xs = [0.01, 0.0, 0.005]  # the first drawn lies furthest right: it is still placed first
    placed = [x + o for x, o in zip(xs, spread(xs, gap))]
    assert placed[0] < placed[1] < placed[2] and placed[1] - placed[0] == pytest.approx(gap)
    assert sum(placed) / 3 == pytest.approx(0.005)  # about the midpoint of the measured ends


def test_the_memory_axis_spreads_little_with_small_markers_and_says_how_close_the_bytes_are(tmp_path, figures):
    from vkv.sweep.plot_quality import MEASURED, MEMORY_MOST, draw_quality, same_memory

    table = _table([("a", 3.2, 94722.0, 1.0, 0.3), ("b", 3.2, 93988.0, 0.8, 0.2),
                    ("a", 16.0, 18940.0, 0.9, 0.1), ("b", 16.0, 14131.0, 0.5, 0.0)])  # fmt: skip
    draw_quality(table, tmp_path / "m.png", {})
    fig = figures["m.png"]
    memory = next(ax for ax in fig.axes if "MiB" in ax.get_xlabel())
    ratio = next(ax for ax in fig.axes if ax.get_title() == "mean retention")
    drawn = {line.get_color(): sorted(line.get_xdata()) for line in _markers(memory)}
    (a16, a3), (b16, b3) = drawn["#0072B2"], drawn["#E69F00"]
    assert (a16, b16) == (18940.0, 14131.0)  # far apart: at their measured bytes
    assert a3 < b3  # drawing order (a first) though a holds more bytes
    for x, measured in ((a3, 94722.0), (b3, 93988.0)):
        assert 0 < abs(math.log(x / measured)) <= MEMORY_MOST + 1e-9  # moved, but under 2 %
    sizes = {ax: {line.get_markersize() for line in _markers(ax)} for ax in (memory, ratio)}
    assert max(sizes[memory]) < min(sizes[ratio])  # smaller markers on the memory axis
    for ax, values in ((memory, [14131.0, 18940.0, 93988.0, 94722.0]), (ratio, [3.2, 16.0])):
        (ticks,) = [line for line in ax.lines if line.get_gid() == "measured x"]
        assert sorted(ticks.get_xdata()) == values and ticks.get_color() == MEASURED  # grey, at every measured x
        plain = [line for line in ax.lines if line.get_marker() in (None, "None", "") and line.get_color() != "grey"]
        assert not plain  # no connector line (only the grey reference lines have no marker)
    assert same_memory({"a": table[:2]}) == pytest.approx(94722 / 93988 - 1)
    told = _texts(fig).replace("\n", " ")
    assert (
        "hold the same memory within 34.0% (measured)" in told
    )  # 16×: 18940 vs 14131 and "light-grey ticks" in told.lower()
    assert "no line joins a point to its tick" in told and "thin line" not in told


def test_the_distance_and_quality_figures_share_one_order_and_mark_the_reference(tmp_path, figures):
    from vkv.sweep.plot_quality import draw_quality
    from vkv.sweep.plots import draw_distance, legend_names, methods

    variants = [f"{LONG}{i}" for i in range(3)]  # ranked 2, 0, 1 by retention: drawn in the order 0, 1, 2
    retention = {variants[0]: 0.8, variants[1]: 0.7, variants[2]: 0.9}
    table = _table([(v, 8.0, 1000.0, retention[v], 0.5 * retention[v]) for v in variants])
    columns = ["0–127", "128–511"]
    cells = {(v, 8.0): {c: _cell(retention[v]) for c in columns} for v in variants}
    names = legend_names(methods(table))
    assert names == {}  # one option, which tells them apart: each named by its whole label
    draw_quality(table, tmp_path / "q.png", names, reference=variants[1])
    draw_distance(columns, cells, table, tmp_path / "d.png", names, reference=variants[1])
    order = methods(table, variants[1])
    for fig in (figures["q.png"], figures["d.png"]):
        ax = next(ax for ax in fig.axes if ax.axison)
        colours = {line.get_color(): line.get_xdata()[0] for line in _markers(ax)}
        lefts = [colours[c] for c in ("#0072B2", "#E69F00", "#009E73")]  # styles 0, 1, 2: `methods`' order
        assert lefts == sorted(lefts) and len(set(lefts)) == 3
        legend = _texts(fig)
        assert f"{variants[1]} (reference; 12 windows)" in legend or "(reference; 5" in legend
        assert legend.count("(reference;") == 1
    assert order == sorted(variants)


def test_every_figure_names_variants_by_method_and_the_option_that_tells_them_apart(tmp_path, figures):
    from vkv.sweep.plot_losses import draw_losses
    from vkv.sweep.plot_quality import draw_quality
    from vkv.sweep.plot_questions import draw_heatmap
    from vkv.sweep.plots import draw_distance, legend_names, methods

    lines = []
    for i in range(2):
        for ratio in (2.0, 4.0):
            x = line(f"v{i}{ratio}", "vkv", ratio, [True, i == 0, False], pooling="uniform", trace=[3 + i, 2, 1])
            x["variant"] = f"{SHARED}{i}"
            lines.append(x)
    table = _table([(f"{SHARED}{i}", r, 100.0 * r, 0.9 - i / 5 - r / 20, 0.3) for i in range(2) for r in (2.0, 4.0)])
    names = legend_names(methods(table))
    assert names == {f"{SHARED}0": "vkv steps=0", f"{SHARED}1": "vkv steps=1"}
    cells = {(v["variant"], v["ratio_requested"]): {"0–127": _cell(v["mean_retention"])} for v in table}
    keys = {
        "q.png": draw_quality(table, tmp_path / "q.png", names),
        "d.png": draw_distance(["0–127", "128–511"], cells, table, tmp_path / "d.png", names),
        "l.png": draw_losses(lines, tmp_path / "l.png", names),
        "h.png": draw_heatmap(lines, table, tmp_path / "h.png", names),
    }
    for png, md in keys.items():
        fig = figures[png]
        shown = _texts(fig) + "".join(
            t.get_text() for ax in fig.axes for t in [ax.title, *ax.get_xticklabels(), *ax.get_yticklabels()]
        )
        assert "vkv steps=0" in shown and "vkv steps=1" in shown and "vkv-1" not in shown, png
        told = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
        assert "Names: the method and the options that tell its variants apart" in told, png
        assert f"- `vkv steps=1`: {SHARED}1" in md, png  # report.md keys the full label


def _heatmap_lines(values_by_variant):
    lines, table = [], []
    for variant, values in values_by_variant.items():
        x = line(variant, "m", 2.0, [True] * len(values))
        x["variant"] = variant
        for q, value in zip(x["result"]["questions"], values):
            q["retention"] = value
        lines.append(x)
        table.append({"method": "m", "variant": variant, "ratio_requested": 2.0, "mean_retention": sum(values)})
    return lines, table


def _marks(fig, gid):
    return [c for ax in fig.axes for c in ax.collections if c.get_gid() == gid]


def test_the_heatmap_marks_every_cell_outside_zero_to_one_and_counts_them(tmp_path, figures):
    from vkv.sweep.plot_questions import ABOVE, BELOW, MARK_GIDS, draw_heatmap

    values = {"a": (5.46, -0.9, 0.5, 1.05), "b": (0.95, 1.2, -0.1, 0.1)}  # 1.05: within noise of 1, not marked
    lines, table = _heatmap_lines(values)
    notes = draw_heatmap(lines, table, tmp_path / "h.png", {})
    fig = figures["h.png"]
    cells = [v for row in values.values() for v in row]
    above, below = sum(v > ABOVE for v in cells), sum(v < BELOW for v in cells)
    assert (above, below) == (2, 2)
    for gid, count, colour in ((MARK_GIDS["above"], above, (0, 0, 0, 1)), (MARK_GIDS["below"], below, (1, 1, 1, 1))):
        (marks,) = _marks(fig, gid)  # one scatter per kind, one point per cell
        assert len(marks.get_offsets()) == count
        assert all(tuple(c) == colour for c in marks.get_facecolors() if len(c))  # black on light, white on dark
    placed = {tuple(p) for gid in MARK_GIDS.values() for p in _marks(fig, gid)[0].get_offsets()}
    assert len(placed) == 4 and all(x % 1 == 0.5 and y % 1 == 0.5 for x, y in placed)  # each at its cell's centre
    legend = _texts(fig)
    assert f"> {ABOVE:g} (2 cells)" in legend and "< 0 (2 cells)" in legend
    told = " ".join(notes)
    assert "2 cells above 1.1 carry a black dot" in told and "2 cells below 0 carry a white ×" in told


def test_the_heatmap_has_no_marks_or_keys_for_them_when_every_cell_is_in_range(tmp_path, figures):
    from vkv.sweep.plot_questions import MARK_GIDS, draw_heatmap

    lines, table = _heatmap_lines({"a": (0.0, 1.1, 0.5, 0.2), "b": (0.9, 1.0, 0.3, 0.1)})  # the thresholds: unmarked
    notes = draw_heatmap(lines, table, tmp_path / "h.png", {})
    fig = figures["h.png"]
    assert not any(_marks(fig, gid) for gid in MARK_GIDS.values())
    assert "carry a" not in " ".join(notes) and "cells)" not in _texts(fig)


def test_the_heatmap_y_label_names_what_its_rows_show(tmp_path, figures):
    from vkv.sweep.plot_questions import draw_heatmap, row_label

    lines, table = _heatmap_lines({"a": (0.9, 0.2), "b": (0.5, 0.1)})  # one window, the whole of transcript t
    draw_heatmap(lines, table, tmp_path / "h.png", {})
    (ax,) = figures["h.png"].axes
    rows = [t.get_text() for t in ax.get_yticklabels()]
    assert rows and all("@" not in r and r.startswith("t / q") for r in rows)
    assert ax.get_ylabel() == "question (transcript / id)"
    assert row_label(["t@turns1-9 / q0", "t@turns10-19 / q0"]) == "question (transcript@window / id)"
    assert "where it has several" in row_label(["t@turns1-9 / q0", "u / q0"])


def test_the_quality_notes_say_compressed_variants_and_what_retention_above_one_means(tmp_path, figures):
    from vkv.sweep.plot_quality import ABOVE_ONE, draw_quality

    rows = [("a", 2.0, 100.0, 1.3, 0.02), ("b", 2.0, 90.0, 0.6, 0.027), ("a", 4.0, 50.0, 0.9, 0.0)]
    table = _table(rows) + [{"method": "full", "variant": "full", "ratio_requested": None, "ratio_achieved": None,
                             "keyword_accuracy": 0.034, "choice_accuracy": 1.0, "mean_retention": 1.0}]  # fmt: skip
    draw_quality(table, tmp_path / "q.png", {})
    told = _texts(figures["q.png"]).replace("\n", " ")
    assert "keyword accuracy (every compressed variant between 0.000 and 0.027)" in told
    assert "every method" not in told and ABOVE_ONE in told
    draw_quality(_table([(v, r, k, min(ret, 1.0), kw) for v, r, k, ret, kw in rows]), tmp_path / "q1.png", {})
    assert ABOVE_ONE not in _texts(figures["q1.png"]).replace("\n", " ")  # only where a mean lies above 1


def test_the_distance_caption_says_its_y_axis_holds_the_reference_lines():
    from vkv.sweep.report_markdown import CAPTIONS
    from vkv.sweep.report_plots import PLOTS

    caption = CAPTIONS[PLOTS["distance"]]
    assert "the y axis spans the bars and the full- and no-context lines" in caption and "drawn bars" not in caption


def test_a_legend_name_keeps_the_method_and_the_fewest_options_that_tell_its_variant_apart():
    from vkv.sweep.plots import legend_names

    labels = [
        "am",  # run once: its label is its name
        "kvzip head_budget=global normalise=context",
        "kvzip head_budget=uniform normalise=context",
        "kvzip head_budget=global normalise=chunk",
        "Qwen/8bit vkv verbatim_share=0.9 verbatim_source=am",  # results of two models: the model heads the label
        "Qwen/8bit vkv verbatim_share=0.9 verbatim_source=kvzip",
    ]
    assert legend_names(labels) == {  # kvzip's global-context variant needs both options: named by its label
        "kvzip head_budget=uniform normalise=context": "kvzip head_budget=uniform",
        "kvzip head_budget=global normalise=chunk": "kvzip normalise=chunk",
        "Qwen/8bit vkv verbatim_share=0.9 verbatim_source=am": "Qwen/8bit vkv verbatim_source=am",
        "Qwen/8bit vkv verbatim_share=0.9 verbatim_source=kvzip": "Qwen/8bit vkv verbatim_source=kvzip",
    }
