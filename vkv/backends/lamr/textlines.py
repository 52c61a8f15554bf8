"""Source lines exactly as Python's tokenizer counts them, with their character offsets.

`str.splitlines` also breaks on form feeds, vertical tabs and Unicode separators, which `ast` does not, so
line numbers would drift; every module here splits with `split_lines` instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def split_lines(text: str) -> list[str]:
    """Lines with their line endings kept; `''.join(split_lines(t)) == t`."""
    return _LINE.findall(text)


def strip_eol(line: str) -> str:
    return line.rstrip("\r\n")


@dataclass(frozen=True)
class LineIndex:
    """Start offset of every line, to map character spans to line numbers (0-based)."""

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

    def line_of(self, offset: int) -> int:
        """Line containing character `offset` (binary search)."""
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo
