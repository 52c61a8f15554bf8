"""Render kept lines verbatim; each removed run becomes one placeholder comment in the language's syntax.

`fillers` maps a kept header line to the indentation of a body emptied by pruning: an `...` statement goes
there (merged with the placeholder when the removed run follows directly), so Python stays parseable.
"""

from __future__ import annotations

from vkv.backends.lamr.textlines import split_lines, strip_eol

_HASH = {"python", "ruby", "shell", "bash", "sh", "yaml", "toml", "r", "perl", "makefile", "dockerfile"}
_SLASH = {
    "javascript",
    "typescript",
    "tsx",
    "java",
    "go",
    "rust",
    "c",
    "cpp",
    "c++",
    "csharp",
    "c#",
    "kotlin",
    "scala",
    "swift",
    "php",
    "dart",
}
_MARKUP = {"html", "xml", "markdown", "svg"}


def comment_syntax(language: str | None) -> tuple[str, str]:
    """(opening, closing) of a one-line comment; plain text (unknown language) gets no comment marker."""
    lang = (language or "").lower()
    if lang in _HASH:
        return "# ", ""
    if lang in _SLASH:
        return "// ", ""
    if lang in _MARKUP:
        return "<!-- ", " -->"
    if lang in ("sql", "lua", "haskell"):
        return "-- ", ""
    return "", ""


def placeholder(count: int, language: str | None) -> str:
    opening, closing = comment_syntax(language)
    noun = "line" if count == 1 else "lines"
    return f"{opening}... {count} {noun} omitted{closing}"


def render(text: str, kept: set[int], language: str | None, fillers: dict[int, str] | None = None) -> str:
    lines = split_lines(text)
    fillers = fillers or {}
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
            note = placeholder(j - i, language)
            if pending is not None and note.startswith("#"):
                emit(f"{pending}...  {note}{newline}")
            elif pending is not None:
                emit(f"{pending}...{newline}")
                emit(f"{pending}{note}{newline}")
            else:
                emit(f"{_indent(code[0])}{note}{newline}")
            pending = None
        i = j
    if pending is not None:
        emit(f"{pending}...{newline}")
    if out and not text.endswith(("\n", "\r")):
        out[-1] = strip_eol(out[-1])  # the input had no final newline; neither does the output
    return "".join(out)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _dominant_newline(lines: list[str]) -> str:
    for line in lines:
        if line.endswith("\r\n"):
            return "\r\n"
        if line.endswith("\n"):
            return "\n"
        if line.endswith("\r"):
            return "\r"
    return "\n"
