"""The report figures' marks and keys: measured x as grey ticks (no connectors), a tight memory-axis spread with
its note, one left-to-right order in every figure, the reference marked, each figure's own alias key."""

from __future__ import annotations

import math

import pytest

from tests.report_helpers import _cell, _markers, _texts, keep_figures, line

LONG = "vkv a_setting_with_a_long_name="  # long enough for an alias


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
    from vkv.sweep.plots import aliases, draw_distance, methods

    variants = [f"{LONG}{i}" for i in range(3)]  # ranked 2, 0, 1 by retention: drawn in the order 0, 1, 2
    retention = {variants[0]: 0.8, variants[1]: 0.7, variants[2]: 0.9}
    table = _table([(v, 8.0, 1000.0, retention[v], 0.5 * retention[v]) for v in variants])
    columns = ["0–127", "128–511"]
    cells = {(v, 8.0): {c: _cell(retention[v]) for c in columns} for v in variants}
    names = aliases(methods(table))
    draw_quality(table, tmp_path / "q.png", names, reference=variants[1])
    draw_distance(columns, cells, table, tmp_path / "d.png", names, reference=variants[1])
    order = methods(table, variants[1])
    for fig in (figures["q.png"], figures["d.png"]):
        ax = next(ax for ax in fig.axes if ax.axison)
        colours = {line.get_color(): line.get_xdata()[0] for line in _markers(ax)}
        lefts = [colours[c] for c in ("#0072B2", "#E69F00", "#009E73")]  # styles 0, 1, 2: `methods`' order
        assert lefts == sorted(lefts) and len(set(lefts)) == 3
        legend = _texts(fig)
        assert f"{names[variants[1]]} (reference; 12 windows)" in legend or "(reference; 5" in legend
        assert legend.count("(reference;") == 1
    assert order == sorted(variants)


def test_every_figure_with_aliases_keys_them_in_its_own_notes(tmp_path, figures):
    from vkv.sweep.plot_losses import draw_losses
    from vkv.sweep.plot_quality import draw_quality
    from vkv.sweep.plot_questions import draw_heatmap
    from vkv.sweep.plots import aliases, draw_distance, methods

    lines = []
    for i in range(2):
        for ratio in (2.0, 4.0):
            x = line(f"v{i}{ratio}", "vkv", ratio, [True, i == 0, False], pooling="uniform", trace=[3 + i, 2, 1])
            x["variant"] = f"{LONG}{i}"
            lines.append(x)
    table = _table([(f"{LONG}{i}", r, 100.0 * r, 0.9 - i / 5 - r / 20, 0.3) for i in range(2) for r in (2.0, 4.0)])
    names = aliases(methods(table))
    cells = {(v["variant"], v["ratio_requested"]): {"0–127": _cell(v["mean_retention"])} for v in table}
    draw_quality(table, tmp_path / "q.png", names)
    draw_distance(["0–127", "128–511"], cells, table, tmp_path / "d.png", names)
    draw_losses(lines, tmp_path / "l.png", names)
    draw_heatmap(lines, table, tmp_path / "h.png", names)
    for png in ("q.png", "d.png", "l.png", "h.png"):
        told = " ".join(t.get_text() for t in figures[png].texts).replace("\n", " ")
        assert f"Aliases: vkv-1 = {LONG}0; vkv-2 = {LONG}1." in told, png
