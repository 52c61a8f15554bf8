"""Units for code, read off a tree-sitter parse: statements inside containers become removable units.

A *container* is a node whose children are statements (a block, a class body, a `case`). Its own
opening and closing tokens (`{`, `}`, `case x:`) stay with the enclosing unit as skeleton, as does
any child sharing a line with them; the other children, grouped when they share lines, become units.
"""

from __future__ import annotations

from vkv.backends.longcodezip.languages import NODE_ROLES, NodeRoles
from vkv.backends.longcodezip.units import UnitBuilder
from vkv.backends.source.languages import Language
from vkv.backends.source.treesitter import require_parser

_OPENERS = ("{", ":")  # the token ending a container's header, in order of preference


def add_syntax_units(builder: UnitBuilder, lines: list[str], offset: int, parent: int, language: Language) -> None:
    """Parse `lines` (document lines from `offset`) and add their units below `parent`."""
    source = "".join(lines).encode("utf-8")
    tree = require_parser(language.name).parse(source)
    walker = _Walker(
        builder, language.name, NODE_ROLES[language.name], [line.encode("utf-8") for line in lines], offset
    )
    walker.container(tree.root_node, parent, is_root=True)
    builder.parse_errors |= tree.root_node.has_error


class _Walker:
    def __init__(self, builder: UnitBuilder, language: str, roles: NodeRoles, line_bytes: list[bytes], offset: int):
        self.builder = builder
        self.language = language
        self.roles = roles
        self.line_bytes = line_bytes
        self.offset = offset

    # ---- line spans --------------------------------------------------------------------------
    def first(self, node) -> int:
        return node.start_point.row + self.offset

    def last(self, node) -> int:
        row, column = node.end_point.row, node.end_point.column
        if column == 0 and row > node.start_point.row:
            row -= 1  # a node ending with its newline does not occupy the next line
        return min(row, len(self.line_bytes) - 1) + self.offset

    def span_lines(self, nodes) -> set[int]:
        return {line for node in nodes for line in range(self.first(node), self.last(node) + 1)}

    # ---- containers --------------------------------------------------------------------------
    def container(self, node, unit: int, is_root: bool = False) -> None:
        """Turn the statement children of `node` into units below `unit`."""
        items = self.flatten(node.children)
        header, closer = ([], []) if is_root else self.header_and_closer(node, items)
        skeleton = self.span_lines(header + closer) | (set() if is_root else self.shared_lines(node))
        interior = [item for item in items if item not in header and item not in closer]
        children = []
        for group in self.groups(interior):
            first, last = self.first(group[0]), max(self.last(n) for n in group)
            if any(first <= line <= last for line in skeleton):
                continue  # shares a line with the braces or the header: it stays skeleton
            children.append(self.add_group(group, unit, first, last))
        needs_statement = self.roles.empty_body_needs_statement and not is_root
        self.builder.add_body(unit, children, needs_statement)

    def flatten(self, nodes) -> list:
        out = []
        for node in nodes:
            if node.is_named and node.type in self.roles.transparent:
                out.extend(self.flatten(node.children))
            else:
                out.append(node)
        return out

    def header_and_closer(self, node, items) -> tuple[list, list]:
        opener = next(
            (i for token in _OPENERS for i, item in enumerate(items) if item.type == token and not item.is_named), None
        )
        if opener is not None:
            header = items[: opener + 1]
        elif items and not items[0].is_named:  # `#ifdef X`, `case 1` …: the first line is the header
            header = [item for item in items if self.first(item) == self.first(node)]
        else:
            header = []
        closer = [items[-1]] if items and not items[-1].is_named and items[-1] not in header else []
        return header, closer

    def shared_lines(self, node) -> set[int]:
        """The container's first/last line when other code shares it (`if x: y`, `} else {`)."""
        shared = set()
        start_row, start_col = node.start_point.row, node.start_point.column
        if self.line_bytes[start_row][:start_col].strip():
            shared.add(start_row + self.offset)
        end_row, end_col = node.end_point.row, node.end_point.column
        ends_at_newline = end_col == 0 and end_row > start_row
        if not ends_at_newline and end_row < len(self.line_bytes) and self.line_bytes[end_row][end_col:].strip():
            shared.add(end_row + self.offset)
        return shared

    def groups(self, items) -> list[list]:
        """Consecutive items merged while they share a line (`a = 1; b = 2`, a statement and its `;`)."""
        groups: list[list] = []
        for item in sorted(items, key=lambda n: n.start_byte):
            if groups and self.first(item) <= max(self.last(n) for n in groups[-1]):
                groups[-1].append(item)
            elif item.is_named:
                groups.append([item])
            elif groups:
                groups[-1].append(item)  # a stray `;` or `,` on its own line joins what precedes it
        return groups

    def add_group(self, group, parent: int, first: int, last: int) -> int:
        kind, name = self.classify(group, first)
        uid = self.builder.add_unit(parent, first, last, kind, name, self.language)
        for node in group:
            if node.is_named:
                for inner in self.find_containers(node):
                    self.container(inner, uid)
        return uid

    def find_containers(self, node) -> list:
        if self.is_container(node):
            return [node]
        found = []
        for child in node.children:
            found.extend(self.find_containers(child))
        return found

    def is_container(self, node) -> bool:
        if node.type not in self.roles.containers or not node.is_named:
            return False
        parent = node.parent
        return parent is None or (node.type, parent.type) not in self.roles.not_container_under

    # ---- what a unit is ----------------------------------------------------------------------
    def classify(self, group, first: int) -> tuple[str, str]:
        named = [n for n in group if n.is_named]
        main = max(named, key=lambda n: (self.last(n) - self.first(n), n.type not in self.roles.comments))
        if main.type in self.roles.comments:
            return "comment", self.first_text(first)
        if main.type in self.roles.attached:
            return "attached", self.first_text(first)
        definition = self.definition_in(main)
        if definition is None:
            return "code", self.first_text(first)
        kind = "class" if definition.type in self.roles.classes else "function"
        name = self.definition_name(definition) or self.name_near(main) or self.first_text(first)
        return kind, name

    def definition_in(self, node, depth: int = 0):
        """The function or class `node` is (through export/decorator wrappers), or mostly consists of."""
        if node.type in self.roles.functions or node.type in self.roles.classes:
            return node
        if node.type in self.roles.wrappers:
            inner = [c for c in node.named_children if c.type not in self.roles.comments]
            return self.definition_in(inner[-1], depth) if inner else None
        if depth >= 3:
            return None
        span = self.last(node) - self.first(node) + 1
        for child in node.named_children:
            found = self.definition_in(child, depth + 1)
            if found is not None and 2 * (self.last(found) - self.first(found) + 1) >= span:
                return found  # `const f = () => {…}`, `module.exports = function () {…}`
        return None

    def definition_name(self, node) -> str | None:
        for _ in range(5):  # C declarators nest: function_definition → function_declarator → identifier
            name = node.child_by_field_name("name")
            if name is not None:
                return name.text.decode("utf-8", "replace")
            declarator = node.child_by_field_name("declarator")
            if declarator is None:
                break
            node = declarator
        if node.type.endswith("identifier"):
            return node.text.decode("utf-8", "replace")
        return None

    def name_near(self, node, depth: int = 0) -> str | None:
        """The first `name` field below `node` (`const f = …` names its arrow function `f`)."""
        name = node.child_by_field_name("name")
        if name is not None:
            return name.text.decode("utf-8", "replace")
        if depth < 2:
            for child in node.named_children:
                found = self.name_near(child, depth + 1)
                if found:
                    return found
        return None

    def first_text(self, line: int) -> str:
        return self.line_bytes[line - self.offset].decode("utf-8", "replace").strip()[:60]
