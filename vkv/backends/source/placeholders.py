"""The line that stands for a run of elided lines: `# … 12 lines omitted`, in the language's comment syntax."""

from __future__ import annotations


def placeholder_line(
    omitted: int,
    comment: tuple[str, str],
    indent: str = "",
    ending: str = "\n",
    statement: bool = False,
    ellipsis: str = "…",
) -> str:
    """`indent`, the count of `omitted` lines inside the (opening, closing) `comment` (bare when both are ""),
    then `ending`. With `statement`, `...` comes first: where Python would be left with an empty body the
    line must be a statement, and `...` is the one that does nothing."""
    opening, closing = comment
    count = f"{ellipsis} {omitted} {'line' if omitted == 1 else 'lines'} omitted"
    text = " ".join(part for part in (opening, count, closing) if part)
    return f"{indent}{'...  ' if statement else ''}{text}{ending}"
