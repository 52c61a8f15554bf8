"""What tests/test_report.py builds its sweeps from and reads its figures with: a results line, a breakdown cell,
a figure's text and its data lines."""

from __future__ import annotations

import re


def line(run_id, method, ratio, correct, seed=0, pooling=None, trace=(), span=100):
    run = {
        "model": "smollm2-135m",
        "quant": "fp32",
        "transcript": "t.json",
        "method": method,
        "ratio": ratio,
        "seed": seed,
    }
    config = {"pooling": pooling, "optim": {"steps": 3, "seed": seed}} if pooling else {}
    entries = {"full": span, "none": 0}.get(method, round(span / ratio) if ratio else span)
    questions = [
        {
            "id": f"q{i}",
            "keyword_correct": c,
            "choice_correct": c,
            "retention": 1.0 if c else 0.2,
            "fidelity_kl": 0.0 if c else 0.5,
            "weak": False,
            "distance_tokens": 300 * i,
            "kind": ("decision", "change")[i % 2],
        }
        for i, c in enumerate(correct)
    ]
    result = {
        "transcript": "t@turns1-3",
        "split": "test",
        "method": method,
        "ratio_requested": ratio,
        "ratio_achieved": round(span / entries, 4) if entries else None,
        "span_tokens": span,
        "compressed_entries": entries,
        "seconds": 2.0,
        "questions": questions,
        "loss_trace": list(trace),
        "optimisation": {"best_loss": min(trace)} if trace else {},
    }
    return {
        "run_id": run_id,
        "sweep": "unit",
        "run": run,
        "identity": {"quant": "fp32", "config": config, "eval": {"max_new_tokens": 4}},
        "git": {"revision": "abc"},
        "seed": seed,
        "wall_seconds": 3.0,
        "peak_memory_mb": 900.0,
        "device": "cpu",
        "result": result,
    }


def _cell(mean, windows=5, questions=10):
    from vkv.sweep.breakdowns import Cell

    return Cell(mean, questions, mean - 0.05, mean + 0.05, windows)


def _texts(fig) -> str:
    legends = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    legends += [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    return "\n".join(
        [*legends, *(t.get_text() for t in fig.texts), *(t.get_text() for ax in fig.axes for t in ax.texts)]
    )


def _markers(ax) -> list:
    """A panel's data lines (not the grey references or the measured-x ticks)."""
    return [line for line in ax.lines if line.get_marker() not in (None, "None", "|", "_")]  # "_": error bar caps


def keep_figures(monkeypatch) -> dict:
    """Keep every figure saved open, by file name, for a test to read (the body of a `figures` fixture)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    saved, original = {}, Figure.savefig

    def keep(fig, path, *args, **kwargs):
        name = str(path).rsplit("/", 1)[-1]  # written first as .NAME.RANDOM.tmp beside NAME (vkv.io.atomic_path)
        saved[re.sub(r"^\.(.+)\.[^.]+\.tmp$", r"\1", name)] = fig
        return original(fig, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved
