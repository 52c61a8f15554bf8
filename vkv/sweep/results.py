"""Results files: append-only JSON lines that survive `kill -9`, merged across shards when read.

One whole line per `os.write` on an O_APPEND descriptor, then fsync: a crash loses at most the run in flight.
A write cut short (only a full disk or a crash inside the call can do that) leaves a trailing partial line;
readers ignore it and the next writer cuts it off. One writer per file, enforced with flock."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from vkv.errors import VkvError
from vkv.io import check_output, parse_json, read_input
from vkv.sweep.grid import jsonable


def results_name(i: int, n: int) -> str:
    return "results.jsonl" if n == 1 else f"results.rank{i}.jsonl"


@dataclass(frozen=True)
class Skipped:
    """A line of a results file that holds no run: where it is and why it was left out."""

    path: Path
    line: int
    why: str


def read_results(
    out: str | os.PathLike,
    name_glob: str = "results*.jsonl",
    latest: bool = False,
    skipped: list[Skipped] | None = None,
    required: str | None = None,
) -> list[dict]:
    """Complete lines of every matching file in `out`, each run once: its first line (results are never
    replaced), or with `latest` its last (errors: the most recent attempt). Lines that are not JSON objects, that
    hold no object under `required`, or that a write left cut short are left out and added to `skipped`; without
    that list they are named on stderr."""
    seen: dict[str, dict] = {}
    left_out: list[Skipped] = []
    for path in sorted(Path(out).glob(name_glob)):
        for line in _complete_lines(path, left_out, required):
            key = line.get("run_id") or line.get("unit") or f"{path}:{len(seen)}"
            if latest:
                seen.pop(key, None)
                seen[key] = line
            else:
                seen.setdefault(key, line)
    if skipped is not None:
        skipped.extend(left_out)
    else:
        for sentence in skipped_sentences(left_out):
            print(f"warning: {sentence}", file=sys.stderr)
    return list(seen.values())


def skipped_sentences(skipped: list[Skipped]) -> list[str]:
    """One sentence per file naming the lines left out of it and why, e.g. `results.jsonl: skipped 2 lines holding
    no run: line 3 (not a JSON object), line 9 (cut short by an unfinished write)`."""
    by_file: dict[Path, list[Skipped]] = {}
    for s in skipped:
        by_file.setdefault(s.path, []).append(s)
    return [
        f"{path}: skipped {len(lines)} line{'s' if len(lines) > 1 else ''} holding no run: "
        + ", ".join(f"line {s.line} ({s.why})" for s in lines)
        for path, lines in by_file.items()
    ]


def _complete_lines(path: Path, skipped: list[Skipped], required: str | None) -> list[dict]:
    data = read_input(path, "results file")  # bounded: a FIFO or device named results*.jsonl is refused
    body = data[: data.rfind(b"\n") + 1]  # a trailing partial line (a write cut by a crash) is not a result
    lines = []
    raw_lines = body.splitlines()
    for number, raw in enumerate(raw_lines, 1):
        try:
            line = parse_json(raw, f"{path}:{number}", "results line")
        except (VkvError, UnicodeDecodeError):  # malformed, or nested deeper than any result
            line = None
        if not isinstance(line, dict):
            skipped.append(Skipped(path, number, "not a JSON object"))
        elif required and not isinstance(line.get(required), dict):
            skipped.append(Skipped(path, number, f"no {required} object"))
        else:
            lines.append(line)
    if len(body) < len(data):
        skipped.append(Skipped(path, len(raw_lines) + 1, "cut short by an unfinished write"))
    return lines


class ResultsFile:
    """Append-only JSON lines, one whole line per os.write on an O_APPEND descriptor, fsynced; one writer."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        check_output(path, "--out", "json")  # appended to, not replaced: still never a link, device or foreign file
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_NOFOLLOW  # a link put there meanwhile too
        self.fd = os.open(path, flags, 0o644)
        if not stat.S_ISREG(os.fstat(self.fd).st_mode):  # a FIFO or device there would hang or swallow results
            os.close(self.fd)
            raise VkvError(f"{path}: the results file is not a regular file; remove it or give another --out")
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise VkvError(f"{path}: another sweep is writing this file; give it another --out or --shard") from None
        self.cut_partial_line()

    def cut_partial_line(self) -> None:
        """Cut what follows the last newline, reading back from the end (a results file may be large)."""
        size = end = os.fstat(self.fd).st_size
        keep = 0
        while end > 0:
            start = max(0, end - 2**16)
            at = os.pread(self.fd, end - start, start).rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        if keep < size:
            os.ftruncate(self.fd, keep)
            os.fsync(self.fd)

    def append(self, record: dict) -> None:
        line = (json.dumps(record, default=jsonable, ensure_ascii=False) + "\n").encode("utf-8")
        written = os.write(self.fd, line)
        if written != len(line):  # only a full disk does this; cut the fragment so the file stays whole
            self.cut_partial_line()
            raise VkvError(f"{self.path}: short write ({written} of {len(line)} bytes); is the disk full?")
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)
