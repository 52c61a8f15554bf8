"""Kept lines verbatim; every run of removed lines becomes one placeholder comment.

The placeholder takes the indentation of the first removed non-blank line and the comment syntax of
the language at that line (a fenced block inside a transcript uses its own language). Where Python
needs a statement, the placeholder is `...` followed by the comment.
"""

from __future__ import annotations

import numpy as np

from vkv.backends.longcodezip.units import Document
from vkv.backends.source.languages import LANGUAGES
from vkv.backends.source.lines import indentation
from vkv.backends.source.placeholders import placeholder_line


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
        out.append(_placeholder_for_run(doc, i, j, statement_lines))
        i = j
    return "".join(out)


def _placeholder_for_run(doc: Document, start: int, end: int, statement_lines: set[int]) -> str:
    """The one line standing for the removed lines [start, end)."""
    statement = next((line for line in range(start, end) if line in statement_lines), None)
    anchor = statement
    if anchor is None:
        anchor = next((line for line in range(start, end) if doc.lines[line].strip()), start)
    line = doc.lines[anchor]
    indent = indentation(line, " \t") if line.strip() else ""
    comment = LANGUAGES[doc.line_language[anchor]].comment
    last = doc.lines[end - 1]
    ending = "\r\n" if last.endswith("\r\n") else ("\n" if last.endswith("\n") else "")
    return placeholder_line(end - start, comment, indent, ending, statement=statement is not None)
