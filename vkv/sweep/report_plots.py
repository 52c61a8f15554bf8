"""The report's side of its PNGs: which files it writes and what each is drawn from; the drawing itself is
`vkv.sweep.plots`."""

from __future__ import annotations

from pathlib import Path

from vkv.sweep.breakdowns import breakdown
from vkv.sweep.variants import SweepResults

PLOTS = {
    "quality": "quality_vs_ratio.png",
    "distance": "retention_vs_distance.png",
    "loss": "loss_curves.png",
    "heatmap": "question_heatmap.png",
}


def plots(
    results: SweepResults, table_rows: list[dict], out: Path, reference: str | None = None
) -> dict[str, list[str]]:
    """Write the PNGs that have data (vkv.sweep.plots and its siblings); returns {file name: report.md lines under it
    (full labels of shortened names, what was left out)}. `reference` (the `--vs` variant) is drawn wherever the
    figures thin out a crowded panel. Needs matplotlib (pip install 'vkv[plots]')."""
    try:
        import matplotlib  # optional dependency (vkv[plots])

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: F401
    except ImportError:
        return {}
    from vkv.sweep import plot_losses, plot_quality, plot_questions
    from vkv.sweep import plots as draw

    out.mkdir(parents=True, exist_ok=True)
    names = draw.legend_names(draw.methods(table_rows))  # one name per variant, the same in every figure
    distances = breakdown(results, "distance_tokens")
    drawn = {
        "quality": lambda path: plot_quality.draw_quality(table_rows, path, names, reference),
        "distance": lambda path: draw.draw_distance(*distances, table_rows, path, names, reference),
        "loss": lambda path: plot_losses.draw_losses(results.lines, path, names),
        "heatmap": lambda path: plot_questions.draw_heatmap(results.lines, table_rows, path, names, reference),
    }
    notes = {PLOTS[name]: plot(out / PLOTS[name]) for name, plot in drawn.items()}
    return {image: lines for image, lines in notes.items() if lines is not None}
