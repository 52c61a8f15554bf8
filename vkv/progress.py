"""Rich progress bars for optimisation loops: step, loss and ETA."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def make_progress(console=None) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


@contextmanager
def step_bar(description: str, total: int, console=None) -> Iterator[Callable[[int, float], None]]:
    """Yields an `on_step(step, loss)` callback that advances a bar of `total` steps."""
    with make_progress(console) as progress:
        task = progress.add_task(description, total=total, loss="—")

        def on_step(step: int, loss: float) -> None:
            progress.update(task, completed=step, loss=f"{loss:.4f}")

        yield on_step
        progress.update(task, completed=total)
