"""Kept lines verbatim; every run of removed lines becomes one placeholder comment.

The placeholder takes the indentation of the first removed non-blank line and the comment syntax of
the language at that line (a fenced block inside a transcript uses its own language). Where Python
needs a statement, the placeholder is `...` followed by the comment.
"""

from __future__ import annotations

import numpy as np

from vkv.backends.longcodezip.document import Document
from vkv.backends.longcodezip.languages import LANGUAGES


def render(doc: Document, kept: np.ndarray, statement_lines: set[int], start: int = 0, end: int | None = None) -> str:
    """The text of lines [start, end) with removed runs replaced by placeholders."""
    end = len(doc.lines) if end is None else end
    out: list[str] = []
    i = start
    while i < end:
        if kept[i]:
            out.append(doc.lines[i])
            i += 1
            continue
        j = i
        while j < end and not kept[j]:
            j += 1
        out.append(placeholder_line(doc, i, j, statement_lines))
        i = j
    return "".join(out)


def placeholder_line(doc: Document, start: int, end: int, statement_lines: set[int]) -> str:
    statement = next((line for line in range(start, end) if line in statement_lines), None)
    anchor = statement
    if anchor is None:
        anchor = next((line for line in range(start, end) if doc.lines[line].strip()), start)
    line = doc.lines[anchor]
    indent = line[: len(line) - len(line.lstrip(" \t"))] if line.strip() else ""
    text = LANGUAGES[doc.line_language[anchor]].placeholder(end - start)
    if statement is not None:
        text = "...  " + text
    last = doc.lines[end - 1]
    ending = "\r\n" if last.endswith("\r\n") else ("\n" if last.endswith("\n") else "")
    return indent + text + ending
