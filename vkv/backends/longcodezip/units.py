"""A text split into lines and a tree of removable units, the shape every later stage works on.

A *unit* is the smallest piece that can be removed without breaking the syntax: a statement, a
definition, a comment, a line of prose. A unit that contains other units (a function, a class, an
`if`) owns only its *skeleton* lines — signature, `else:` lines, closing braces — and keeping any of
its children keeps that skeleton. Whitespace-only lines belong to no unit: they are kept exactly when
the lines around them are. document.py builds the tree; syntax.py and prose.py add its units.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vkv.backends.source.languages import Language

FREE = -1  # owner of a whitespace-only line


@dataclass
class Body:
    """The removable children of one container, e.g. the statements of a function body."""

    children: list[int]
    needs_statement: bool  # removing every child leaves a syntax error unless a statement stands in


@dataclass
class Unit:
    parent: int  # enclosing unit, -1 for the root
    start: int  # first line (0-based, inclusive)
    end: int  # last line (inclusive)
    kind: str  # root | function | class | comment | attached | code | text | fence | message
    name: str
    language: str
    bodies: list[Body] = field(default_factory=list)

    @property
    def is_definition(self) -> bool:
        return self.kind in ("function", "class", "fence", "message")


@dataclass
class Document:
    lines: list[str]  # original lines, each with its own line ending
    language: Language
    units: list[Unit]
    owner: list[int]  # per line: the unit whose removal removes this line, or FREE
    line_language: list[str]  # per line: the language a placeholder there must be written in
    parse_errors: bool = False
    messages: list[tuple[int, int]] | None = None  # line span [start, end) of each message, if built from messages

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def top_level(self) -> list[int]:
        return [child for body in self.units[0].bodies for child in body.children]

    def children(self, unit: int) -> list[int]:
        return sorted((c for body in self.units[unit].bodies for c in body.children), key=lambda c: self.units[c].start)


class UnitBuilder:
    """Collects units while a parser walks the text; inner units take their lines from outer ones."""

    def __init__(self, lines: list[str], language: Language):
        self.lines = lines
        self.language = language
        self.units = [Unit(-1, 0, max(len(lines) - 1, 0), "root", "", language.name)]
        self.owner = [0] * len(lines)
        self.line_language = [language.name] * len(lines)
        self.parse_errors = False

    def add_unit(self, parent: int, start: int, end: int, kind: str, name: str, language: str) -> int:
        uid = len(self.units)
        self.units.append(Unit(parent, start, end, kind, name, language))
        for line in range(start, end + 1):
            self.owner[line] = uid
            self.line_language[line] = language
        return uid

    def add_body(self, parent: int, children: list[int], needs_statement: bool) -> None:
        if children:
            self.units[parent].bodies.append(Body(children, needs_statement))

    def finish(self, messages: list[tuple[int, int]] | None = None) -> Document:
        owner = [FREE if not line.strip() else o for line, o in zip(self.lines, self.owner)]
        return Document(self.lines, self.language, self.units, owner, self.line_language, self.parse_errors, messages)
