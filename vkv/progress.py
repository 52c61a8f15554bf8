"""Progress of every long loop, always on stderr so that stdout keeps the results.

On a terminal: rich bars (count, elapsed, time left). Otherwise (a log file, CI, `2> log`): plain lines, one when a
task starts, one at each tenth of its count at most every few seconds, one every PERIOD seconds while it runs without
news (a prefill, a model load), and one when it ends: `sweep: 12/40 (30%), 3m12s elapsed, ~7m28s left`.

`make_progress()` has rich's Progress API (add_task, update, advance, remove_task, console) for several tasks at
once; `step_bar` counts one optimisation's steps and loss; `status` times one step that has no count.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

PERIOD = 30.0  # seconds between lines of a task that reports nothing new
STEP_GAP = 5.0  # seconds at least between a task's lines at tenths of its count

stderr = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)


def clock(seconds: float) -> str:
    """Seconds as 45s, 3m12s or 1h04m."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def fields_text(fields: dict[str, Any]) -> str:
    """A task's extra fields (loss, …) as `loss 0.0123`, empty ones left out."""
    return " ".join(f"{k} {v}" for k, v in fields.items() if v not in ("", None, "—"))


class FieldsColumn(ProgressColumn):
    def render(self, task) -> Text:
        return Text(fields_text(task.fields))


class CountColumn(MofNCompleteColumn):
    """M/N, or nothing for a task without a count (a status)."""

    def render(self, task) -> Text:
        return super().render(task) if task.total is not None else Text("")


_active: list[Progress | LineProgress] = []  # the display open now: tasks started inside it join it


@contextmanager
def make_progress(console: Console | None = None) -> Iterator[Progress | LineProgress]:
    """A progress display for several tasks on stderr (`console`, when given, must write there): rich's bars on a
    terminal, plain lines otherwise; inside another one's `with`, that one (a terminal holds one live display)."""
    if _active:
        yield _active[-1]
        return
    console = console if console is not None and console.stderr else stderr
    if console.is_terminal:
        columns = (TextColumn("[bold]{task.description}"), BarColumn(), CountColumn(), FieldsColumn())
        display = Progress(*columns, TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False)
    else:
        display = LineProgress(console)
    _active.append(display)
    try:
        with display:
            yield display
    finally:
        _active.remove(display)


@contextmanager
def _task(description: str, total: float | None = None, **fields: Any) -> Iterator[tuple[Any, int]]:
    """One task on the open display (or a new one), removed when the `with` ends."""
    with make_progress() as progress:
        task = progress.add_task(description, total=total, **fields)
        try:
            yield progress, task
        finally:
            progress.remove_task(task)


@dataclass
class LineTask:
    description: str
    total: float | None
    fields: dict[str, Any]
    started: float = field(default_factory=time.monotonic)
    completed: float = 0
    printed: float = field(default_factory=time.monotonic)  # when its last line was printed
    tenth: int = 0  # the last tenth of its count a line was printed at

    def line(self, now: float, finished: bool = False) -> str:
        elapsed = now - self.started
        extra = fields_text(self.fields)
        extra = f", {extra}" if extra else ""
        if finished:
            count = f" {self.completed:g}/{self.total:g}" if self.total else ""
            return f"{self.description}: done{count} in {clock(elapsed)}{extra}"
        if not self.total:
            count = f"{self.completed:g} done, " if self.completed else ""
            return f"{self.description}: {count}{clock(elapsed)} elapsed{extra}"
        share = self.completed / self.total
        left = f", ~{clock(elapsed / share - elapsed)} left" if self.completed else ""
        return f"{self.description}: {self.completed:g}/{self.total:g} ({share:.0%}), {clock(elapsed)} elapsed{left}{extra}"


class LineProgress:
    """Rich's Progress API, written as plain lines (see the module's docstring); a thread prints the tasks that have
    said nothing for PERIOD seconds."""

    def __init__(self, console: Console, period: float = PERIOD):
        self.console = console
        self.period = period
        self.tasks: dict[int, LineTask] = {}
        self._ids = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> LineProgress:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if self._ticker is None:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, daemon=True, name="vkv-progress")
            self._ticker.start()

    def stop(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None

    def _tick(self) -> None:
        while not self._stop.wait(min(self.period, 1.0)):
            now = time.monotonic()
            with self._lock:
                for task in self.tasks.values():
                    if now - task.printed >= self.period:
                        self._print(task, now)

    def _print(self, task: LineTask, now: float, finished: bool = False) -> None:
        task.printed = now
        self.console.print(task.line(now, finished), highlight=False, markup=False, soft_wrap=True)

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        with self._lock:
            self._ids += 1
            task = self.tasks[self._ids] = LineTask(description, total, fields)
            self._print(task, task.started)
            return self._ids

    def update(
        self,
        task_id: int,
        completed: float | None = None,
        advance: float | None = None,
        total: float | None = None,
        description: str | None = None,
        **fields: Any,
    ) -> None:
        with self._lock:
            task = self.tasks[task_id]
            task.total = total if total is not None else task.total
            task.description = description or task.description
            task.completed = completed if completed is not None else task.completed + (advance or 0)
            task.fields.update(fields)
            now = time.monotonic()
            tenth = int(10 * task.completed / task.total) if task.total else 0
            if task.total and task.completed >= task.total:
                self._print(task, now, finished=True)
                task.tenth = 10
            elif tenth > task.tenth and now - task.printed >= STEP_GAP:
                task.tenth = tenth
                self._print(task, now)

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def remove_task(self, task_id: int) -> None:
        with self._lock:
            task = self.tasks.pop(task_id)
            if task.tenth < 10:  # its end not printed yet
                self._print(task, time.monotonic(), finished=True)


@contextmanager
def step_bar(description: str, total: int) -> Iterator[Callable[[int, float], None]]:
    """Yields an `on_step(step, loss)` callback that advances a bar of `total` steps (on stderr)."""
    with _task(description, total, loss="—") as (progress, task):

        def on_step(step: int, loss: float) -> None:
            progress.update(task, completed=step, loss=f"{loss:.4f}")

        yield on_step
        progress.update(task, completed=total)


@contextmanager
def status(description: str) -> Iterator[None]:
    """One step without a count (loading a model, a prefill), timed on stderr: a bar with its elapsed time on a
    terminal; a line when it starts, every PERIOD seconds and when it ends otherwise."""
    with _task(description):
        yield


@contextmanager
def counted(description: str, total: int | None) -> Iterator[Callable[[], None]]:
    """A count of `total` units of work (runs, windows, lengths) across a command; yields `done()`, called after each."""
    with _task(description, total) as (progress, task):
        yield lambda: progress.advance(task)
