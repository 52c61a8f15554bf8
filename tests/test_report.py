"""`vkv report`: tables, PNG plots and report.md built only from results files (merged across shards)."""

from __future__ import annotations

import json

import pytest

from tests.report_helpers import _cell, _markers, _texts, keep_figures, line
from vkv.errors import VkvError
from vkv.sweep.breakdowns import breakdown, per_question
from vkv.sweep.paired import paired
from vkv.sweep.pooled_rows import rows
from vkv.sweep.report import ReportConfig, run_report
from vkv.sweep.variants import load


@pytest.fixture
def sweep_dir(tmp_path):
    lines0 = [
        line("f", "full", None, [True, True, True]),
        line("n", "none", None, [False, False, False]),
        line("v1", "vkv", 2.0, [True, True, False], pooling="uniform", trace=[4, 2, 1]),
        line("v2", "vkv", 4.0, [True, False, False], pooling="uniform", trace=[5, 3, 2]),
    ]
    lines1 = [
        line("v3", "vkv", 2.0, [True, True, True], pooling="surprisal", trace=[4, 1, 0.5]),
        line("v4", "vkv", 4.0, [True, True, False], pooling="surprisal", trace=[5, 2, 1]),
        line("t1", "truncate", 2.0, [False, True, False]),
        line("v1", "vkv", 2.0, [False] * 3),
    ]  # duplicate id
    lines1[2]["result"]["stored_entries"] = 80  # truncate's 50 real entries in 80 slots (as if padded per head)
    (tmp_path / "results.rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines0))
    (tmp_path / "results.rank1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines1) + '{"run_id": "x", "re')
    (tmp_path / "errors.jsonl").write_text(
        json.dumps({"unit": "t@turns1-3", "method": "vkv", "ratio": 8.0, "error": "VkvError: something"}) + "\n"
    )
    return tmp_path


def test_rows_pool_results_per_variant_and_ratio(sweep_dir):
    results = load(sweep_dir)
    assert len(results.lines) == 7  # shards merged, the duplicate and the partial line ignored
    table = {(r["variant"], r["ratio_requested"]): r for r in rows(results)}
    assert set(table) == {
        ("full", None),
        ("none", None),
        ("truncate", 2.0),
        ("vkv pooling=uniform", 2.0),
        ("vkv pooling=uniform", 4.0),
        ("vkv pooling=surprisal", 2.0),
        ("vkv pooling=surprisal", 4.0),
    }
    assert table[("vkv pooling=uniform", 2.0)]["keyword_accuracy"] == pytest.approx(2 / 3)
    assert table[("vkv pooling=surprisal", 2.0)]["keyword_accuracy"] == pytest.approx(1.0)
    assert table[("vkv pooling=surprisal", 4.0)]["final_loss"] == pytest.approx(1.0)
    assert table[("truncate", 2.0)]["ratio_achieved"] == pytest.approx(2.0)
    assert table[("truncate", 2.0)]["ratio_stored"] == pytest.approx(100 / 80)
    assert table[("vkv pooling=uniform", 2.0)]["ratio_stored"] is None  # not recorded: unknown, not guessed
    assert list(table)[:2] == [("full", None), ("none", None)]
    cols, names, grid = per_question(results)
    assert names[-1] == "t@turns1-3 / q2"  # the question that fails most often comes last
    assert cols[0] == "full" and len(grid) == 3


def test_variant_names_skip_sections_another_setting_leaves_empty(tmp_path):
    """reuse's `recipe` is None for am and a whole recipe for vkv: its fields do not name variants (method does),
    while a top-level field that is None in some runs of a method still does."""
    lines = []
    for i, (inner, carry, recipe) in enumerate(
        [("am", "as-is", None), ("am", "fresh", None), ("vkv", "as-is", {"steps": 15, "pooling": "surprisal"})]
    ):
        x = line(f"r{i}", "reuse", 3.2, [True, False])
        x["identity"]["config"] = {"method": inner, "carry": carry, "recipe": recipe}
        lines.append(x)
    for i, granularity in enumerate([None, "head"]):
        x = line(f"k{i}", "kvzip", 3.2, [True, True])
        x["identity"]["config"] = {"granularity": granularity}
        lines.append(x)
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    variants = [x["variant"] for x in load(tmp_path).lines]
    assert variants == [
        "reuse carry=as-is method=am",
        "reuse carry=fresh method=am",
        "reuse carry=as-is method=vkv",
        "kvzip granularity=—",
        "kvzip granularity=head",
    ]


def test_report_writes_tables_pngs_and_markdown(sweep_dir, capsys):
    assert run_report(sweep_dir) == 0
    printed = capsys.readouterr().out
    assert "keyword acc" in printed and "vkv pooling=surprisal" in printed and "something" in printed
    out = sweep_dir / "report"
    for png in ("quality_vs_ratio.png", "retention_vs_distance.png", "loss_curves.png", "question_heatmap.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in (out / "report.md").read_text()
    md = (out / "report.md").read_text()
    # achieved, stored, in memory, span KiB (the fixture runs record no bytes in memory), runs, questions, weak
    assert "| vkv pooling=surprisal | 2.0 | 2.00 | — | — | — | 1 | 3 | 0 | 1.000 |" in md
    assert "7 finished runs" in md and "## Failed runs" in md
    # per transcript: retention of vkv pooling=surprisal at 2× is (1 + 1 + 1) / 3, recall kept not measured (runs
    # without clozes), choice accuracy 1
    assert "| vkv pooling=surprisal | 2.0 | 1.000 / — / 1.00 |" in md and "| method | ratio | t |" in md


def test_report_names_the_results_lines_it_skips_on_stderr_and_in_the_markdown(sweep_dir, capsys):
    rank0 = sweep_dir / "results.rank0.jsonl"
    rank0.write_text(rank0.read_text() + 'not json\n{"run_id": "z"}\n[1, 2]\n')  # lines 5-7 of four good ones
    assert run_report(sweep_dir) == 0
    err = capsys.readouterr().err
    md = (sweep_dir / "report" / "report.md").read_text()
    said = f"{rank0}: skipped 3 lines holding no run: line 5 (not a JSON object), line 6 (no result object), line 7"
    cut = f"{sweep_dir / 'results.rank1.jsonl'}: skipped 1 line holding no run: line 5 (cut short"
    for text in (err, md):
        assert said in text and cut in text
    assert "7 finished runs" in md


def test_report_on_an_empty_directory_says_what_to_do(tmp_path):
    with pytest.raises(VkvError, match="run `vkv sweep"):
        load(tmp_path)


def test_paired_differences_against_a_reference(sweep_dir):
    results = load(sweep_dir)
    diffs = {(r["variant"], r["ratio_requested"]): r for r in paired(results, "truncate")}
    # truncate at 2x is the only reference row; the 4x variants have nothing to pair with, references are skipped
    assert set(diffs) == {("vkv pooling=uniform", 2.0), ("vkv pooling=surprisal", 2.0)}
    surprisal = diffs[("vkv pooling=surprisal", 2.0)]
    # retention per question: vkv (1, 1, 1) − truncate (0.2, 1, 0.2); one window, so the interval has no width
    assert surprisal["retention"].mean == pytest.approx(1.6 / 3)
    assert surprisal["retention"].low == pytest.approx(1.6 / 3) and surprisal["retention"].separable
    assert surprisal["choice"].mean == pytest.approx(2 / 3) and surprisal["reference"] == "truncate"
    uniform = diffs[("vkv pooling=uniform", 2.0)]  # (1, 1, 0.2) − (0.2, 1, 0.2)
    assert uniform["retention"].mean == pytest.approx(0.8 / 3)
    with pytest.raises(VkvError, match="names no run"):
        paired(results, "snapkv")
    with pytest.raises(VkvError, match="several variants"):
        paired(results, "vkv")
    # LABEL@RATIO: that one row is every row's reference, whatever its ratio (an ablation at another ratio)
    fixed = {(r["variant"], r["ratio_requested"]): r for r in paired(results, "truncate@2")}
    assert ("vkv pooling=surprisal", 4.0) in fixed and fixed[("vkv pooling=surprisal", 4.0)]["reference"] == (
        "truncate @2x"
    )
    assert fixed[("vkv pooling=surprisal", 2.0)]["retention"].mean == pytest.approx(1.6 / 3)
    with pytest.raises(VkvError, match="truncate has no run at 3x"):
        paired(results, "truncate@3")
    with pytest.raises(VkvError, match="after '@' comes a requested ratio"):
        paired(results, "truncate@fast")


def test_report_vs_prints_and_writes_the_paired_table_and_breakdowns(sweep_dir, capsys):
    assert run_report(sweep_dir, ReportConfig(vs="truncate")) == 0
    printed = capsys.readouterr().out
    assert "paired differences" in printed and "split test" in printed
    md = (sweep_dir / "report" / "report.md").read_text()
    assert "## Paired differences from truncate" in md and "- transcript split: test" in md
    assert (  # Δ retention, Δ recall kept (— : runs without clozes), Δ choice accuracy
        "| vkv pooling=surprisal | 2.0 | truncate | 3 | 1 | +0.533 [+0.533, +0.533] | — | +0.667 [+0.667, +0.667] |"
        in md
    )
    assert "## Retention by distance" in md and "## Retention by question kind" in md


def test_breakdown_by_distance_and_kind(sweep_dir):
    results = load(sweep_dir)
    columns, cells = breakdown(results, "distance_tokens")
    assert columns == ["0–127", "128–511", "512–2047"]  # questions at 0, 300 and 600 tokens
    row = cells[("truncate", 2.0)]
    assert {c: (cell.mean, cell.questions) for c, cell in row.items()} == {
        "0–127": (0.2, 1),
        "128–511": (1.0, 1),
        "512–2047": (0.2, 1),
    }
    assert all(cell.low <= cell.mean <= cell.high for cell in row.values())
    columns, cells = breakdown(results, "kind")
    assert columns == ["change", "decision"]
    assert (cells[("truncate", 2.0)]["decision"].mean, cells[("truncate", 2.0)]["decision"].questions) == (
        pytest.approx(0.2),
        2,
    )


def test_distance_buckets_reach_past_four_thousand_tokens():
    from vkv.sweep.breakdowns import _bucket

    assert [_bucket(t) for t in (0, 127, 128, 2047, 2048, 4095, 4096, 7900)] == [
        "0–127",
        "0–127",
        "128–511",
        "512–2047",
        "2048–4095",
        "2048–4095",
        "≥4096",
        "≥4096",
    ]


@pytest.fixture
def figures(monkeypatch):
    """The figures `vkv report` saves, by file name (kept open for inspection)."""
    return keep_figures(monkeypatch)


def test_plots_tick_the_measured_ratios_label_axes_and_name_their_intervals(sweep_dir, figures):
    assert run_report(sweep_dir) == 0
    quality = figures["quality_vs_ratio.png"]
    achieved = sorted({r["ratio_achieved"] for r in rows(load(sweep_dir)) if r["method"] not in ("full", "none")})
    ratio_axes = [ax for ax in quality.axes if "achieved ratio" in ax.get_xlabel()]
    assert ratio_axes and all(ax.get_ylabel() for ax in quality.axes if ax.axison)  # the blank cell holds the legend
    for ax in ratio_axes:  # a tick at every ratio measured (these are far apart), none elsewhere, each labelled
        assert list(ax.get_xticks()) == pytest.approx(achieved)
        assert [t.get_text() for t in ax.get_xticklabels()] == [f"{x:g}×" for x in achieved]
    text = _texts(quality)
    assert "95 % window-bootstrap intervals" in text and "fewer than 10 windows" in text  # one window each here
    for variant in ("vkv pooling=uniform", "vkv pooling=surprisal", "truncate"):
        assert variant in text
    distance = figures["retention_vs_distance.png"]
    text = _texts(distance)
    assert "95 % window-bootstrap intervals" in text
    drawn = {r["variant"] for r in rows(load(sweep_dir)) if r["method"] not in ("full", "none")}
    assert all(variant in text for variant in drawn)  # drawn in some panel, or named as not drawn there


def test_the_question_heatmap_bins_retention_not_the_keyword_check(sweep_dir, figures):
    from vkv.sweep.plot_questions import BIN_LABELS

    assert run_report(sweep_dir) == 0
    heatmap = figures["question_heatmap.png"]
    (ax,) = heatmap.axes  # no continuous colour bar: the bins are named in the legend
    (mesh,) = ax.collections
    assert mesh.get_cmap().N == len(BIN_LABELS) and "passes" not in _texts(heatmap)
    assert all(label in _texts(heatmap) for label in BIN_LABELS)
    assert "not run" not in _texts(heatmap)  # every column holds every question: no key for white cells
    columns = [t.get_text() for t in ax.get_xticklabels()]
    assert "full" not in columns and "none" not in columns  # retention is 1 and 0 there by definition
    # the fixture's retention is 1.0 for a correct answer and 0.2 otherwise: the top bin (≥ 0.9) and the bottom
    assert set(mesh.get_array().compressed()) == {0.0, len(BIN_LABELS) - 1.0}
    loss = figures["loss_curves.png"]
    assert "no loss curve (no optimiser): full, none, truncate" in _texts(loss)
    assert all("mean over layers" in ax.get_ylabel() for ax in loss.axes if ax.axison)


def test_intervals_from_few_windows_carry_a_caveat(sweep_dir):
    for results in sweep_dir.glob("results*.jsonl"):  # CPU runs: the sweep process's peak RSS
        text = results.read_text().replace(
            '"peak_memory_mb"', '"peak_memory_kind": "process-max-rss", "peak_memory_mb"'
        )
        results.write_text(text)
    assert run_report(sweep_dir) == 0
    md = (sweep_dir / "report" / "report.md").read_text()
    assert "**Caveat: these intervals rest on fewer than 10 windows" in md and "(1 window)" in md
    assert "| ≤900 |" in md  # CPU peaks are the process's, marked as a bound


def test_the_quality_figure_draws_few_enough_variants_for_distinct_colours_and_names_the_rest(tmp_path, figures):
    from vkv.sweep.plot_quality import draw_quality
    from vkv.sweep.plots import LEADING, legend_names, methods, style

    assert len({(style(i)["color"], style(i)["marker"]) for i in range(40)}) == 40
    table = [
        {
            "method": "vkv",
            "variant": f"vkv pooling=surprisal steps={i}",  # the steps tell the variants apart
            "ratio_requested": 2.0,
            "ratio_achieved": 2.0 + i / 10,
            "span_memory_kib": 2048.0 + i,
            "keyword_accuracy": 0.01 * (i % 2),  # flat: its panel is left out
            "choice_accuracy": i / 20,
            "mean_retention": 1 - i / 20,
            "windows": 12,
        }
        for i in range(12)
    ]
    names = legend_names(methods(table))
    notes = draw_quality(table, tmp_path / "q.png", names, reference="vkv pooling=surprisal steps=11")
    quality = figures["q.png"]
    drawn_axes = [ax for ax in quality.axes if ax.axison]  # 3 panels in a 2 × 2 grid: the blank cell holds the legend
    assert len(drawn_axes) == 3 and quality.get_figwidth() <= 12
    blank = [ax for ax in quality.axes if not ax.axison]
    assert len(blank) == 1 and blank[0].get_legend() is not None and not quality.legends
    for ax in drawn_axes:  # the best four and the reference, each in its own colour (and marker)
        drawn = [(line.get_color(), line.get_marker()) for line in _markers(ax)]
        assert len(drawn) == LEADING + 1 and len({colour for colour, _ in drawn}) == LEADING + 1
    assert "keyword accuracy" not in {ax.get_title() for ax in quality.axes}
    assert any("Not drawn: keyword accuracy" in n for n in notes)
    told = " ".join(notes)
    left_out = ", ".join(f"vkv steps={i}" for i in range(4, 11))  # every variant not drawn is named
    assert f"Left out: {left_out};" in told
    legend = [t.get_text() for t in blank[0].get_legend().get_texts()]
    # legends name the method and the option that tells its variants apart, not an alias; report.md the full label
    assert "vkv steps=1 (12 windows)" in legend and not any("pooling" in t for t in legend)
    assert "vkv steps=11 (reference; 12 windows)" in legend
    assert "- `vkv steps=0`: vkv pooling=surprisal steps=0" in notes
    assert [t.get_text() for t in drawn_axes[-1].get_xticklabels()][0] == "2"  # round MiB, plain


def test_points_closer_than_a_marker_are_spread_symmetrically_and_minimally():
    import math

    from vkv.sweep.plot_quality import spread

    gap = 0.05
    same = spread([1.0] * 4, gap)  # four at one x: a gap apart, centred on it, in list order
    assert same == pytest.approx([-1.5 * gap, -0.5 * gap, 0.5 * gap, 1.5 * gap])
    assert spread([0.0, 1.0, 2.0], gap) == [0.0, 0.0, 0.0]  # far apart: each at its measured x
    close = [0.0, 0.01, 1.0]  # two within a gap: moved apart about their midpoint, the third stays
    moved = [x + o for x, o in zip(close, spread(close, gap))]
    assert moved[1] - moved[0] == pytest.approx(gap) and (moved[0] + moved[1]) / 2 == pytest.approx(0.005)
    assert moved[2] == 1.0
    chain = [0.0, 0.03, 0.06, 0.09]  # a run of close points keeps its order and at least the gap
    placed = [x + o for x, o in zip(chain, spread(chain, gap))]
    assert all(b - a >= gap * 0.999 for a, b in zip(placed, placed[1:])) and math.isclose(sum(placed) / 4, 0.045)


def test_the_yellow_gets_a_dark_marker_edge_and_crowded_figures_fit_the_palette():
    from vkv.sweep.plots import OKABE_ITO, leading, style

    yellow = next(i for i in range(8) if style(i)["color"] == "#F0E442")
    assert yellow == len(OKABE_ITO) - 1 and style(yellow)["markeredgecolor"] != "#F0E442"
    table = [{"method": "m", "variant": f"m v={i:02d}-{r}", "ratio_requested": r, "mean_retention": i / 10}
             for r in (2.0, 4.0, 8.0) for i in range(6)]  # fmt: skip
    picked = leading(table)  # 4 best at each of 3 ratios would be 12 variants: fewer, so 8 colours cover them
    assert len(picked.union()) <= len(OKABE_ITO) and picked.keep < 4
    assert str(picked.keep) in picked.notes({})[0]  # the rule states the number it drew


def test_a_crowded_distance_panel_draws_the_best_few_and_says_what_it_left_out(tmp_path, figures):
    from vkv.sweep.plots import LEADING, draw_distance

    columns = ["0–127", "128–511"]
    table, cells = [], {}
    for i in range(8):  # eight variants at 8×, two at 10.667×, one alone at 21.333×
        for ratio in (8.0, 10.667, 21.333)[: 1 + (i < 2) + (i < 1)]:
            variant = f"m v={i}"
            table.append({"method": "m", "variant": variant, "ratio_requested": ratio, "mean_retention": 1 - i / 10,
                          "windows": 5})  # fmt: skip
            cells[(variant, ratio)] = {c: _cell(1 - i / 10) for c in columns}
    notes = draw_distance(columns, cells, table, tmp_path / "d.png", {}, reference="m v=7")
    fig = figures["d.png"]
    panels = [ax for ax in fig.axes if ax.axison]
    assert [ax.get_title() for ax in panels] == ["requested ratio 8×", "requested ratio 10.7×"]
    assert len(panels[0].containers) == LEADING + 1  # the best four, and the reference though it ranks last
    told = " ".join(notes)
    assert f"the {LEADING} variants with the highest mean retention" in told
    assert "and the reference m v=7 wherever it ran" in told
    assert "at 8×: m v=4, m v=5, m v=6" in told  # named, not silently dropped
    assert "Not drawn: 21.3×, where only m v=0 ran" in told
    assert "Left out for lower mean retention" in _texts(fig).replace("\n", " ")


def test_figure_notes_wrap_at_whole_words_within_the_figure():
    from vkv.sweep.plots import wrap_notes

    word = "unbreakable-label_with=parts"
    text = wrap_notes(["short words " * 40 + word + " end", "second note"], 6.0)
    lines = text.split("\n")
    assert len(lines) > 3 and max(map(len, lines)) <= 6 * 72 / (0.6 * 9) + len(word)
    assert word in text.split() and lines[-1] == "second note"


def test_ratios_read_as_a_reader_writes_them():
    from vkv.sweep.plots import column_label, ratio_text

    assert [ratio_text(r) for r in (3.2, 8.0, 10.667, 21.333, 1234.5)] == ["3.2", "8", "10.7", "21.3", "1234"]
    assert column_label("kvzip", 10.667) == "kvzip 10.7×" and column_label("full", None) == "full"


def test_variants_a_crowded_panel_draws_take_the_first_colours():
    from vkv.sweep.plots import methods, style

    table = [{"method": "m", "variant": f"m v={i:02d}", "ratio_requested": 2.0, "mean_retention": i / 20}
             for i in range(12)]  # fmt: skip
    order = methods(table, reference="m v=00")
    assert order[:5] == ["m v=00", "m v=08", "m v=09", "m v=10", "m v=11"] and len(order) == 12
    assert len({style(i)["color"] for i in range(5)}) == 5  # so no two of them share a colour


def test_loss_panels_merge_variants_with_the_same_losses_and_name_missing_ratios(tmp_path, figures):
    from vkv.sweep.plot_losses import draw_losses

    lines = []
    for offset in ("-4", "—"):  # the offset acts after the optimisation: the same losses
        for ratio in (3.2, 8.0):
            x = line(f"o{offset}{ratio}", "vkv", ratio, [True], pooling="uniform", trace=[3, 2, 1])
            x["variant"] = f"vkv share=0.9 virtual_offset={offset}"
            lines.append(x)
    x = line("s", "vkv", 8.0, [True], pooling="uniform", trace=[5, 4, 3])
    x["variant"] = "vkv share=0.75 virtual_offset=—"
    lines.append(x)
    notes = draw_losses(lines, tmp_path / "l.png", {})
    fig = figures["l.png"]
    titles = [ax.get_title() for ax in fig.axes if ax.axison]
    assert titles == [
        "vkv share=0.75 virtual_offset=—",
        "vkv share=0.9 virtual_offset=-4 = vkv share=0.9 virtual_offset=—",
    ]
    assert any("differ only in virtual_offset = -4 / —" in n for n in notes)
    assert any("No 3.2× curve for vkv share=0.75 virtual_offset=—: not run at that ratio" in n for n in notes)
    assert "no curve at 3.2×" in _texts(fig)


def test_the_question_heatmap_caps_its_size_and_counts_what_it_leaves_out(tmp_path, figures):
    from vkv.sweep.plot_questions import MAX_HEIGHT, MAX_ROWS, MAX_WIDTH, draw_heatmap

    lines, table = [], []
    for i in range(12):  # twelve variants at one ratio, each scored on MAX_ROWS + 5 questions
        x = line(f"r{i}", "m", 2.0, [True] * (MAX_ROWS + 5))  # q0 … q(MAX_ROWS + 4)
        x["variant"] = f"m v={i:02d}"
        for j, q in enumerate(x["result"]["questions"]):
            q["retention"] = 1.0 if j < MAX_ROWS + 3 else i / 12  # two questions separate the variants
        if i == 11:
            del x["result"]["questions"][0]  # not scored there: a white cell, keyed
        lines.append(x)
        table.append({"method": "m", "variant": x["variant"], "ratio_requested": 2.0, "mean_retention": i})
    notes = draw_heatmap(lines, table, tmp_path / "h.png", {})
    fig = figures["h.png"]
    assert fig.get_figheight() <= MAX_HEIGHT and fig.get_figwidth() <= MAX_WIDTH
    ax = fig.axes[0]
    assert len(ax.get_yticklabels()) == MAX_ROWS and len(ax.get_xticklabels()) == 4  # the best four variants
    labels = [t.get_text() for t in ax.get_yticklabels()]
    # the two questions that differ most rank lowest; a transcript with one window is named without its turns
    assert labels[-2:] == [f"t / q{MAX_ROWS + 3}", f"t / q{MAX_ROWS + 4}"]
    assert "not run" in _texts(fig) and any("Left out to fit the page: 5 questions" in n for n in notes)
    assert any("at 2×: m v=00, m v=01" in n for n in notes)


def test_quality_points_are_nudged_sideways_and_laid_out_two_panels_a_row(sweep_dir, figures):
    assert run_report(sweep_dir) == 0
    quality = figures["quality_vs_ratio.png"]
    assert quality.get_figwidth() <= 12
    ax = next(ax for ax in quality.axes if "achieved ratio" in ax.get_xlabel())
    at_two = sorted(x for line in _markers(ax) for x in line.get_xdata() if 1.8 < x < 2.2)
    assert len(at_two) == 3 and len(set(at_two)) == 3 and at_two[0] < 2.0 < at_two[-1]  # 3 methods run at 2×
    ticks = [x for line in ax.lines if line.get_gid() == "measured x" for x in line.get_xdata() if 1.8 < x < 2.2]
    assert ticks == [2.0]  # the three points' measured ratio, marked once at the panel's foot
    keyword = next(ax for ax in quality.axes if ax.get_title() == "keyword accuracy")
    assert keyword.containers and all(c.has_yerr for c in keyword.containers)  # its window-bootstrap interval
    table = rows(load(sweep_dir))
    assert all(r["keyword_ci"][0] <= r["keyword_accuracy"] <= r["keyword_ci"][1] for r in table)


def test_distance_panels_name_variants_not_run_there_and_do_not_draw_trends_through_thin_buckets(tmp_path, figures):
    from vkv.sweep.breakdowns import Cell
    from vkv.sweep.plots import draw_distance

    columns = ["0–127", "128–511", "512–2047"]
    table, cells = [], {}
    for i in range(6):  # six variants at 8×, the first four also at 16×
        for ratio in (8.0, 16.0)[: 1 + (i < 4)]:
            variant = f"m v={i}"
            table.append({"method": "m", "variant": variant, "ratio_requested": ratio, "mean_retention": 1 - i / 10,
                          "windows": 5})  # fmt: skip
            cells[(variant, ratio)] = {c: _cell(0.9 - i / 10) for c in columns}
            cells[(variant, ratio)]["128–511"] = _cell(0.3, windows=1, questions=2)  # one window: thin
    cells[("m v=5", 8.0)]["0–127"] = Cell(0.2, 10, -0.6, 0.9, 5)  # left out at 8× (ranked last): no room for it
    notes = draw_distance(columns, cells, table, tmp_path / "d.png", {})
    told = " ".join(notes)
    assert "Not run at a ratio, so not drawn there: m v=4, m v=5 at 16×." in told
    assert "at 8×: m v=4, m v=5" in told  # left out there for lower retention
    panel = next(ax for ax in figures["d.png"].axes if ax.axison)
    assert panel.get_ylim()[0] == pytest.approx(min(0.0, 0.9 - 3 / 10 - 0.05, 0.3 - 0.05) - 0.05)  # the drawn bars
    segments = [line for line in panel.lines if len(line.get_xdata()) == 2 and line.get_color() != "grey"]
    assert segments
    for seg in segments:  # no line into or out of the thin bucket (x near 1): the real ones are joined directly
        x0, x1 = sorted(seg.get_xdata())
        assert abs(x0) < 0.5 and abs(x1 - 2) < 0.5 and seg.get_linestyle() == "-"
    labels = [t.get_text() for t in panel.get_xticklabels()]
    assert labels[:2] == ["0–127\nn=10, 5 win†", "128–511\nn=2, 1 win†"]  # each bucket's questions and windows
    told = _texts(figures["d.png"])
    assert "Hollow markers, not joined" in told and "joined by dotted" not in told
    near = sorted(x for line in _markers(panel) for x in line.get_xdata() if abs(x) < 0.5)
    assert min(b - a for a, b in zip(near, near[1:])) >= 0.14  # the four markers at a bucket a marker's width apart


def test_loss_panels_share_one_y_axis_count_windows_and_say_when_curves_coincide(tmp_path, figures):
    from vkv.sweep.plot_losses import draw_losses

    lines = []
    for i, window in enumerate(("a@turns1-3", "b@turns1-3")):
        for ratio, trace in ((3.2, [3, 2, 1]), (8.0, [3, 2, 1]), (16.0, [9, 8, 7])):  # 3.2× and 8× the same
            x = line(f"c{i}{ratio}", "vkv", ratio, [True], pooling="uniform", trace=trace)
            x["result"]["transcript"] = window
            lines.append(x)
        x = line(f"s{i}", "vkv", 8.0, [True], pooling="surprisal", trace=[0.5, 0.3, 0.2])  # its own, lower scale
        x["result"]["transcript"], x["variant"] = window, "vkv pooling=surprisal"
        lines.append(x)
    for x in lines[:3] + lines[4:7]:
        x["variant"] = "vkv pooling=uniform"
    notes = draw_losses(lines, tmp_path / "l.png", {})
    fig = figures["l.png"]
    panels = [ax for ax in fig.axes if ax.axison]
    assert len(panels) == 2 and panels[0].get_ylim() == panels[1].get_ylim()  # one scale, so panels compare
    assert panels[0].get_shared_y_axes().joined(*panels)
    title = fig.get_suptitle().replace("\n", " ")
    assert "over 2 windows" in title and "one y axis for every panel" in title
    assert "3.2× and 8×: curves coincide" in _texts(fig)
    assert any("vkv pooling=uniform: the 3.2× and 8× curves coincide" in n for n in notes)
    assert not any("16×" in n and "coincide" in n for n in notes)


def test_the_question_heatmap_counts_weak_questions_and_names_variants_not_run(tmp_path, figures):
    from vkv.sweep.plot_questions import draw_heatmap

    lines, table = [], []
    for variant, ratio, retention in (("a", 2.0, 1.0), ("b", 2.0, 0.5), ("a", 4.0, 0.6), ("c", 4.0, 0.1)):
        x = line(f"{variant}{ratio}", "m", ratio, [True] * 4)
        x["variant"] = variant
        for j, q in enumerate(x["result"]["questions"]):
            q["retention"] = retention * (j + 1) / 4
        x["result"]["questions"][3].update(weak=True, retention=None)  # full context ≈ no context there
        lines.append(x)
        table.append({"method": "m", "variant": variant, "ratio_requested": ratio, "mean_retention": retention})
    notes = draw_heatmap(lines, table, tmp_path / "h.png", {})
    fig = figures["h.png"]
    title = fig.get_suptitle().replace("\n", " ")
    assert "the 3 of 4 questions" in title and "1 weak, with no retention, not drawn" in title  # 3 + 1 = 4 asked
    told = " ".join(notes)
    assert "Not drawn: 1 weak question " in told
    assert "Not run at a ratio, so not drawn there: c at 2×; b at 4×." in told
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    extent = fig._suptitle.get_window_extent(FigureCanvasAgg(fig).get_renderer())
    assert extent.x0 >= 0 and extent.x1 <= fig.bbox.width  # wrapped within the figure: it widens nothing


def test_heatmap_rows_say_they_are_clipped_and_notes_give_the_range_outside_zero_to_one(tmp_path, figures):
    from vkv.sweep.plot_questions import draw_heatmap, range_note

    lines, table = [], []
    for variant, values in (("a", (1.0, -3.84, 0.5, 0.2)), ("b", (0.9, 0.4, 7.0, 0.1))):
        x = line(variant, "m", 2.0, [True] * 4)
        x["variant"] = variant
        for q, value in zip(x["result"]["questions"], values):
            q["retention"] = value
        lines.append(x)
        table.append({"method": "m", "variant": variant, "ratio_requested": 2.0, "mean_retention": sum(values)})
    notes = draw_heatmap(lines, table, tmp_path / "h.png", {})
    title = figures["h.png"].get_suptitle().replace("\n", " ")
    assert "Rows by mean retention clipped to [0, 1] over the columns" in title
    told = " ".join(notes)
    assert "25% of the drawn cells lie outside [0, 1], from −3.84 to 7.00" in told  # 2 of 8 cells
    assert "end bins" in told and "open" in told
    import numpy as np

    assert "every drawn cell lies within [0, 1], from 0.10 to 0.90" in range_note(np.array([[0.1, np.nan, 0.9]]))


def test_breakdown_caveats_name_the_buckets_under_ten_windows(sweep_dir):
    from vkv.sweep.breakdowns import Cell
    from vkv.sweep.table_cells import few_window_cells

    def cell(windows):
        return Cell(0.5, 10, 0.4, 0.6, windows)

    rows_ = [("a 2×", {"0–127": cell(4), "128–511": cell(1), "≥4096": cell(12)}),
             ("b 2×", {"0–127": cell(4), "128–511": cell(1), "≥4096": cell(12)}),
             ("c 2×", {"0–127": cell(12), "128–511": cell(3)})]  # fmt: skip
    text = few_window_cells(rows_, ["0–127", "128–511", "≥4096"])
    assert "in a 2×, b 2×: 0–127 (4 windows), 128–511 (1 window); in c 2×: 128–511 (3 windows)." in text
    assert "≥4096" not in text and few_window_cells(rows_[:1], ["≥4096"]) is None
    assert run_report(sweep_dir) == 0
    md = (sweep_dir / "report" / "report.md").read_text()
    section = md.split("## Retention by distance")[1].split("## ")[0]
    assert "these cells rest on fewer than 10 windows" in section
    assert "in every row: 0–127 (1 window), 128–511 (1 window), 512–2047 (1 window)." in section
