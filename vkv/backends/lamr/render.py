"""Render kept lines verbatim; each removed run becomes one placeholder comment in the language's syntax.

`fillers` maps a kept header line to the indentation of a body emptied by pruning: an `...` statement goes
there (merged with the placeholder when the removed run follows directly), so Python stays parseable.
"""

from __future__ import annotations

from vkv.backends.source.languages import find_language
from vkv.backends.source.lines import indentation, split_lines, strip_eol
from vkv.backends.source.placeholders import placeholder_line

_ELLIPSIS = "..."  # LaMR's placeholders have always read `# ... 3 lines omitted`, in ASCII


def _comment_syntax(language: str | None) -> tuple[str, str]:
    """(opening, closing) of a one-line comment; plain text and unknown languages get no comment marker."""
    found = find_language(language)
    return found.comment if found is not None and found.name != "text" else ("", "")


def render(text: str, kept: set[int], language: str | None, fillers: dict[int, str] | None = None) -> str:
    lines = split_lines(text)
    fillers = fillers or {}
    comment = _comment_syntax(language)
    newline = _dominant_newline(lines)
    out: list[str] = []

    def emit(line: str) -> None:
        if out and not out[-1].endswith(("\n", "\r")):
            out[-1] += newline
        out.append(line)

    pending: str | None = None  # indentation of an `...` owed to the last kept header
    i = 0
    while i < len(lines):
        if i in kept:
            if pending is not None:
                emit(f"{pending}...{newline}")
                pending = None
            emit(lines[i])
            pending = fillers.get(i)
            i += 1
            continue
        j = i
        while j < len(lines) and j not in kept:
            j += 1
        code = [line for line in lines[i:j] if line.strip()]
        if code:
            if pending is not None and comment[0] == "#":  # only a `#` comment may share the `...` line
                emit(placeholder_line(j - i, comment, pending, newline, statement=True, ellipsis=_ELLIPSIS))
            elif pending is not None:
                emit(f"{pending}...{newline}")
                emit(placeholder_line(j - i, comment, pending, newline, ellipsis=_ELLIPSIS))
            else:
                emit(placeholder_line(j - i, comment, indentation(code[0]), newline, ellipsis=_ELLIPSIS))
            pending = None
        i = j
    if pending is not None:
        emit(f"{pending}...{newline}")
    if out and not text.endswith(("\n", "\r")):
        out[-1] = strip_eol(out[-1])  # the input had no final newline; neither does the output
    return "".join(out)


def _dominant_newline(lines: list[str]) -> str:
    for line in lines:
        if line.endswith("\r\n"):
            return "\r\n"
        if line.endswith("\n"):
            return "\n"
        if line.endswith("\r"):
            return "\r"
    return "\n"
