"""Units for text without a grammar: every non-blank line removable, fenced code split by its language."""

from __future__ import annotations

import re

from vkv.backends.longcodezip.languages import fence_language
from vkv.backends.longcodezip.syntax import add_syntax_units
from vkv.backends.longcodezip.units import UnitBuilder
from vkv.backends.source.languages import Language

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def add_prose_units(
    builder: UnitBuilder, lines: list[str], offset: int, parent: int, language: Language, fences: bool = True
) -> None:
    """Add the units of `lines` (which start at document line `offset`) as children of `parent`."""
    fenced = fences and language.name in ("text", "markdown")  # transcripts and notes carry ``` code fences
    children: list[int] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i].rstrip("\r\n")) if fenced else None
        if opening:
            close = _closing_fence(lines, i, opening.group(1))
            children.append(_add_fence(builder, lines, offset, parent, i, close, opening.group(2), language))
            i = close + 1
            continue
        if lines[i].strip():
            name = lines[i].strip()[:60]
            children.append(builder.add_unit(parent, offset + i, offset + i, "text", name, language.name))
        i += 1
    builder.add_body(parent, children, needs_statement=False)


def _closing_fence(lines: list[str], opening: int, marker: str) -> int:
    """Index of the line closing the fence opened at `opening`; the last line if it is never closed."""
    for j in range(opening + 1, len(lines)):
        stripped = lines[j].strip()
        if stripped.startswith(marker[0] * len(marker)) and not stripped.strip(marker[0]):
            return j
    return len(lines) - 1


def _add_fence(builder, lines, offset, parent, i, close, info, language) -> int:
    code = fence_language(info)
    fence = builder.add_unit(parent, offset + i, offset + close, "fence", info.strip() or "code", language.name)
    inner = lines[i + 1 : close] if _FENCE.match(lines[close].rstrip("\r\n")) and close > i else lines[i + 1 :]
    if not inner:
        return fence
    if code is not None and code.grammar is not None:
        add_syntax_units(builder, inner, offset + i + 1, fence, code)
    else:
        add_prose_units(builder, inner, offset + i + 1, fence, code or language, fences=False)
    return fence
