"""Text as a list of lines, each with its own line ending, and where each line starts.

Neither backend uses `str.splitlines`: it also breaks on form feeds, vertical tabs and Unicode separators,
which neither Python's tokenizer nor tree-sitter counts as line ends, so line numbers would drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANY_ENDING = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_LINE_FEED_ENDING = re.compile(r"[^\n]*\n|[^\n]+\Z")


def split_lines(text: str, line_feed_only: bool = False) -> list[str]:
    """Lines with their endings kept, so `''.join(split_lines(t)) == t`.

    A line ends at "\\r\\n", "\\r" or "\\n", as Python's tokenizer and `ast` count rows; with
    `line_feed_only` only "\\n" ends one (a "\\r" stays inside its line), as tree-sitter counts rows.
    """
    return (_LINE_FEED_ENDING if line_feed_only else _ANY_ENDING).findall(text)


def strip_eol(line: str) -> str:
    return line.rstrip("\r\n")


def indentation(line: str, whitespace: str | None = None) -> str:
    """The leading `whitespace` characters of `line` (any whitespace when None, as `str.lstrip`)."""
    return line[: len(line) - len(line.lstrip(whitespace))]


@dataclass(frozen=True)
class LineIndex:
    """Start offset of every line (split as split_lines does by default), to map characters to lines."""

    lines: list[str]
    starts: list[int]

    @classmethod
    def of(cls, text: str) -> LineIndex:
        lines = split_lines(text)
        starts, offset = [], 0
        for line in lines:
            starts.append(offset)
            offset += len(line)
        return cls(lines, starts)

    def __len__(self) -> int:
        return len(self.lines)

    def content_span(self, i: int) -> tuple[int, int]:
        """Character span of line i without its line ending."""
        start = self.starts[i]
        return start, start + len(strip_eol(self.lines[i]))
