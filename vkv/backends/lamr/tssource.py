"""Structure of non-Python source through tree-sitter, limited to edges that are simple across languages.

What is covered (JavaScript, TypeScript/TSX, Java, Go, Rust, C, C++ via the per-language grammar wheels):
enclosing constructs (the first line of every ancestor that is not a mere container such as a block or
an argument list: function, class, if, loop headers), bracket partners (an opening bracket's line pulls in
its closing bracket's line and back, which closes the blocks those headers open), and import statements
(Go: import specs) whose imported names appear in given lines. What is not: definitions of used names and call
sites (scoping rules differ per language), and C/C++ `#include`s (a header's name says nothing about the
identifiers it declares). Nothing here guarantees the pruned output parses; only Python has that promise.
"""

from __future__ import annotations

import re

from vkv.backends.source.languages import canonical_name
from vkv.backends.source.lines import indentation, split_lines
from vkv.backends.source.treesitter import parser_for

_IMPORT_NODES = {
    "javascript": {"import_statement"},
    "typescript": {"import_statement"},
    "tsx": {"import_statement"},
    "java": {"import_declaration"},
    "go": {"import_spec"},
    "rust": {"use_declaration"},
}
_IMPORT_KEYWORDS = {"import", "from", "use", "as", "static", "crate", "self", "super", "type", "package"}
_PAIRS = {"(": ")", "[": "]", "{": "}"}
# Nodes whose first line is not a header of what they hold (their parent's header is).
_CONTAINERS = {
    "statement_list",
    "block",
    "statement_block",
    "compound_statement",
    "declaration_list",
    "field_declaration_list",
    "class_body",
    "interface_body",
    "enum_body",
    "switch_body",
    "program",
    "source_file",
    "translation_unit",
    "expression_list",
    "argument_list",
    "arguments",
    "parameter_list",
    "formal_parameters",
    "parameters",
    "literal_value",
    "object",
    "array",
}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TsSource:
    """A tree-sitter parse of `text` with the line-level edges listed in the module docstring."""

    def __init__(self, text: str, language: str):
        lang = canonical_name(language)
        parser = parser_for(lang) if lang is not None else None
        if parser is None:
            raise ValueError(f"no tree-sitter grammar is installed for language '{language}'")
        self.language = lang
        self.lines = split_lines(text)
        self.tree = parser.parse(text.encode("utf-8"))
        self.partners: dict[int, set[int]] = {}
        self.imports: list[tuple[range, set[str]]] = []
        self._index(self.tree.root_node)

    def enclosing_lines(self, line: int) -> set[int]:
        """Header lines of the constructs around the code on `line`."""
        text = self.lines[line] if line < len(self.lines) else ""
        if not text.strip():
            return set()
        column = len(indentation(text).encode("utf-8"))
        node = self.tree.root_node.descendant_for_point_range((line, column), (line, column))
        found: set[int] = set()
        while node is not None and node.parent is not None:
            if node.type not in _CONTAINERS and node.start_point[0] != line:
                found.add(node.start_point[0])
            node = node.parent
        return found

    def referenced_imports(self, words: set[str]) -> set[int]:
        """Lines of import statements that import one of `words`."""
        return {line for span, names in self.imports if names & words for line in span}

    def _index(self, root) -> None:
        import_types = _IMPORT_NODES.get(self.language, set())
        stack = [root]
        while stack:
            node = stack.pop()
            if node.type in import_types:
                end_row, end_column = node.end_point
                last = end_row - 1 if end_column == 0 and end_row > node.start_point[0] else end_row
                span = range(node.start_point[0], last + 1)
                names = set(_WORD.findall(node.text.decode("utf-8", "replace"))) - _IMPORT_KEYWORDS
                self.imports.append((span, names))
            self._pair_brackets(node.children)
            stack.extend(node.children)

    def _pair_brackets(self, children) -> None:
        openings: list = []
        for child in children:
            if child.type in _PAIRS:
                openings.append(child)
            elif openings and child.type == _PAIRS[openings[-1].type]:
                opening = openings.pop()
                a, b = opening.start_point[0], child.start_point[0]
                if a != b:
                    self.partners.setdefault(a, set()).add(b)
                    self.partners.setdefault(b, set()).add(a)


def words_on(lines: list[str], indices) -> set[str]:
    return {w for i in indices if 0 <= i < len(lines) for w in _WORD.findall(lines[i])}
