"""`vkv report`'s question_heatmap.png: which facts degrade first, as each question's retention per method variant.

Retention (the share of the full context's evidence for the reference answer that a method keeps) separates methods
question by question where the keyword check, on a small model, passes almost nowhere; it is binned, since one
question's retention is noisy and can leave [0, 1], and drawn on a five-step colour-blind-safe sequential scale
(cividis). Columns are the variants `vkv.sweep.plots.leading` picks per requested ratio, grouped by ratio; rows are
the questions where those columns differ most, as many as fit a page. Everything left out is counted in the notes.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from vkv.sweep.plots import _finish, full_label_key, leading, ratio_text, shortened_note, wrap_notes

BINS = (0.25, 0.5, 0.75, 0.9)  # retention bin edges: 0.9 and up reads as kept, under 0.25 as lost
BIN_LABELS = ("< 0.25", "0.25–0.5", "0.5–0.75", "0.75–0.9", "≥ 0.9")
ROW_INCH, FRAME_INCH, MAX_HEIGHT = 0.18, 2.5, 14.0  # per question row, title and labels, the figure's most
MAX_ROWS = int((MAX_HEIGHT - FRAME_INCH) / ROW_INCH)  # questions that fit
CELL_INCH, LABELS_INCH, MAX_WIDTH = 0.32, 4.5, 12.0  # per column, question labels and legend margin, the most
# Cells past these are marked, since the open end bins draw them like 0.95 or 0.10. Above 1.1, not 1: a question's
# retention is noisy, and a little over 1 is the full context's own value within noise; below 0, no tolerance: the
# compressed context then backs the reference answer less than no context at all.
ABOVE, BELOW = 1.1, 0.0
MARK_GIDS = {"above": "retention above 1.1", "below": "retention below 0"}  # the marks' artists, for tests


def question_retention(lines: list[dict]) -> dict[tuple[str, float], dict[str, float]]:
    """{(variant, requested ratio): {"window / question": retention}}, seeds averaged; weak questions (the full
    context hardly beats no context, so retention is undefined) are left out."""
    values: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line in lines:
        result = line["result"]
        for q in result["questions"]:
            if not q.get("weak") and q.get("retention") is not None:
                values[(line["variant"], result["ratio_requested"])][f"{result['transcript']} / {q['id']}"].append(
                    q["retention"]
                )
    return {key: {q: sum(v) / len(v) for q, v in row.items()} for key, row in values.items()}


def asked(lines: list[dict], columns: list[tuple[str, float]]) -> set[str]:
    """Every "window / question" the runs of these columns were asked, weak ones included (the table's count)."""
    keys = set(columns)
    return {
        f"{line['result']['transcript']} / {q['id']}"
        for line in lines
        if (line["variant"], line["result"]["ratio_requested"]) in keys
        for q in line["result"]["questions"]
    }


def draw_heatmap(
    lines: list[dict], table_rows: list[dict], path: Path, names: dict[str, str], reference: str | None = None
) -> list[str] | None:
    """Per question (rows) and picked variant × ratio (columns), the binned retention; rows ordered by their mean
    retention over the columns, each cell clipped to [0, 1] (the range and the share outside it are noted), the facts that degrade first at the bottom; white cells: not run there. The title's
    counts add up to every question asked: those drawn, those left out to fit, the weak ones (no retention)."""
    import matplotlib.pyplot as plt  # optional dependency (vkv[plots])

    values = question_retention(lines)
    rows = [r for r in table_rows if (r["variant"], r["ratio_requested"]) in values]
    picked = leading(rows, reference, ran=table_rows)
    columns = [(v, r) for r, drawn in picked.drawn.items() for v in drawn]
    questions = sorted({q for key in columns for q in values[key]})
    if not columns or not questions:
        return None
    weak = len(asked(lines, columns) - set(questions))
    data = np.array([[values[key].get(q, np.nan) for key in columns] for q in questions])
    binned = np.where(np.isnan(data), np.nan, np.digitize(data, BINS))
    spread = np.nanmax(binned, axis=1) - np.nanmin(binned, axis=1)
    keep = sorted(np.argsort(-spread, kind="stable")[:MAX_ROWS], key=lambda i: -np.nanmean(np.clip(data[i], 0, 1)))
    width = min(MAX_WIDTH, LABELS_INCH + CELL_INCH * len(columns))
    fig, ax = plt.subplots(figsize=(width, FRAME_INCH + ROW_INCH * len(keep)))
    handles = _cells(ax, binned[keep], columns, names)
    marked = _out_of_range(ax, data[keep], handles)
    labels = [_question(questions, i) for i in keep]
    ax.set_yticks(np.arange(len(keep)) + 0.5, labels, fontsize=7)
    ax.set_ylabel(row_label(labels))
    extra = [f"{len(questions) - len(keep)} left out to fit"] if len(keep) < len(questions) else []
    extra += [f"{weak} weak, with no retention, not drawn"] if weak else []
    count = f"the {len(keep)} of {len(questions) + weak} questions where these columns differ most"
    count += f" ({'; '.join(extra)})" if extra else ""
    title = (f"retention per question, binned: {count}. Rows by mean retention clipped to [0, 1] over the columns, "
             "the first facts to degrade at the bottom")  # fmt: skip
    fig.suptitle(wrap_notes([title], width, size=9), fontsize=9)  # over the figure, so it widens nothing
    notes = [range_note(data[keep]), *marked, *_heatmap_notes(len(questions) - len(keep), weak, picked, names)]
    key = shortened_note(names, picked.named())
    _finish(fig, path, notes + key, handles, title="retention (1 = full context; 0 = no context)", ncol=len(handles))
    return ["", *notes] + full_label_key(names, picked.named())


def range_note(data: np.ndarray) -> str:
    """How far the drawn cells' retention runs, and the share outside [0, 1], from the data (NaN: not run)."""
    values = data[~np.isnan(data)]
    if not values.size:
        return "No retention drawn."
    outside = float(np.mean((values < 0) | (values > 1)))
    low, high = (f"{v:.2f}".replace("-", "−") for v in (values.min(), values.max()))
    share = f"{outside:.0%} of the drawn cells lie outside [0, 1]" if outside else "every drawn cell lies within [0, 1]"
    return (f"Per-question retention: {share}, from {low} to {high}; the end bins (<\u00a00.25, ≥\u00a00.9) are open, and "
            "rows are ordered by their mean with each cell clipped to [0, 1].")  # fmt: skip


def row_label(labels: list[str]) -> str:
    """The y label, naming what the rows show: the transcript alone where a window is its whole session."""
    if not any("@" in label for label in labels):
        return "question (transcript / id)"
    if all("@" in label for label in labels):
        return "question (transcript@window / id)"
    return "question (transcript[@window, where it has several] / id)"


def _out_of_range(ax, data: np.ndarray, handles: dict) -> list[str]:
    """Mark cells above ABOVE with a black dot (they lie in the light top bin) and below BELOW with a white × (the
    dark bottom bin), one scatter per kind (gid MARK_GIDS); adds their legend handles, with counts, and returns the
    note."""
    from matplotlib.lines import Line2D

    rows, cols = np.indices(data.shape)
    kinds = (
        ("above", data > ABOVE, "o", "black", f"> {ABOVE:g}",
         f"above {ABOVE:g} carry a black dot (the compressed context backs the reference answer more than the full one)"),
        ("below", data < BELOW, "x", "white", f"< {BELOW:g}",
         f"below {BELOW:g} carry a white × (it backs the reference answer less than no context)"),
    )  # fmt: skip
    told = []
    for kind, hit, marker, colour, label, meaning in kinds:  # NaN compares False: cells not run are never marked
        if hit.any():
            ax.scatter(cols[hit] + 0.5, rows[hit] + 0.5, s=10, marker=marker, color=colour, linewidths=1.0,
                       gid=MARK_GIDS[kind], zorder=3)  # fmt: skip
            cells = f"{hit.sum()} cell{'s' if hit.sum() != 1 else ''}"
            handles[f"{label} ({cells})"] = Line2D([], [], marker=marker, linestyle="none", color="black",
                                                       markeredgewidth=1.0, markersize=4)  # fmt: skip
            told.append(f"{cells} {meaning}")
    if not told:
        return []
    return [f"Marked, as the open end bins draw them like 0.95 or 0.10: {'; '.join(told)}."]


def _cells(ax, binned: np.ndarray, columns: list[tuple[str, float]], names: dict[str, str]) -> dict:
    """Draw the binned cells, the column labels and a line between ratio groups (each headed by its ratio); returns
    the legend's handles."""
    import matplotlib.pyplot as plt  # optional dependency (vkv[plots])
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    colours = [plt.get_cmap("cividis")(x) for x in np.linspace(0, 1, len(BIN_LABELS))]
    ax.pcolormesh(np.ma.masked_invalid(binned), cmap=ListedColormap(colours), vmin=-0.5,
                  vmax=len(BIN_LABELS) - 0.5, edgecolors="white", linewidth=0.3)  # fmt: skip
    ax.set_facecolor("white")
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(binned), 0)  # first question on top
    ax.set_xticks(np.arange(len(columns)) + 0.5, [names.get(v, v) for v, _ in columns], rotation=60, ha="right",
                  fontsize=8)  # fmt: skip
    ax.set_xlabel("method variant, grouped by requested ratio")
    ratios = [r for _, r in columns]
    for start in [i for i, r in enumerate(ratios) if i == 0 or r != ratios[i - 1]]:
        if start:
            ax.axvline(start, color="black", linewidth=1.5)
        end = start + ratios[start:].count(ratios[start]) if len(set(ratios)) > 1 else len(ratios)
        ax.text((start + end) / 2, -0.4, f"{ratio_text(ratios[start])}×", ha="center", va="bottom", fontsize=9,
                weight="bold")  # fmt: skip
    handles = {label: Patch(color=c) for label, c in zip(BIN_LABELS, colours)}
    if np.isnan(binned).any():  # a key for white cells only where there are some
        handles["not run"] = Patch(facecolor="white", edgecolor="grey")
    return handles


def _question(questions: list[str], i: int) -> str:
    """A row label; a window that is a whole session ("@turns1-99") is named by its transcript alone when no other
    window of that transcript appears."""
    window, _, question = questions[i].partition(" / ")
    transcript = window.partition("@")[0]
    others = {q.partition(" / ")[0] for q in questions if q.partition("@")[0] == transcript}
    return f"{transcript} / {question}" if len(others) == 1 else questions[i]


def _heatmap_notes(dropped: int, weak: int, picked, names: dict[str, str]) -> list[str]:
    notes = [
        "No error bars: a cell is one run (the mean over seeds where several ran). Full context (retention 1) and "
        "no context (0) are retention's ends by definition and are not drawn.",
        *picked.notes(names),
    ]
    if dropped:
        notes.append(
            f"Left out to fit the page: {dropped} questions where these columns agree most (the smallest spread "
            "of bins across the columns)."
        )
    if weak:
        notes.append(
            f"Not drawn: {weak} weak question{'s' if weak != 1 else ''} (the full context hardly beats no context, "
            "so there is no retention to bin); the results table counts them as weak."
        )
    return notes
