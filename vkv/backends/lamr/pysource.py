"""Python source at line granularity: statements, compound headers, clauses, suites, scopes and names.

Both the rubric labeller (dependency edges) and the AST-aware repair (what must stay for the output to
parse) reason about the same objects, so they are built once here from `ast` plus `tokenize` (only to find
the colon that ends a header, which `ast` does not record). All line numbers are 0-based.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field

from vkv.backends.source.lines import indentation, split_lines

_BODY_FIELDS = ("body", "orelse", "handlers", "finalbody", "cases")
_COMPOUND = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
    ast.Match,
) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_TRIES = (ast.Try,) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())


@dataclass(eq=False)
class Scope:
    """A namespace: module, function or class body, with the units that bind each name in it."""

    kind: str  # "module" | "function" | "class"
    parent: Scope | None
    defs: dict[str, list[Unit]] = field(default_factory=dict)
    attrs: dict[str, list[Unit]] = field(default_factory=dict)  # class scopes: self.<name> = ... sites

    def bind(self, name: str, unit: Unit) -> None:
        self.defs.setdefault(name, []).append(unit)


@dataclass(eq=False)
class Unit:
    """Lines that must be kept or dropped together.

    kind: "statement" (a whole simple statement), "header" (a compound statement's header, decorators
    included, up to its colon) or "clause" (an else/except/finally/case header).
    """

    kind: str
    start: int
    end: int
    node: ast.AST
    parent: Unit | None  # the header or clause whose suite holds this unit; None at module level
    scope: Scope
    uses: set[str] = field(default_factory=set)  # names loaded by this unit's own code
    self_attrs: set[str] = field(default_factory=set)  # attributes read through self./cls.
    calls: set[str] = field(default_factory=set)  # names called (plain or as self.<name>)

    @property
    def lines(self) -> range:
        return range(self.start, self.end + 1)


@dataclass(eq=False)
class Suite:
    """The statements introduced by one header or clause; `indent` is None when they share its line."""

    intro: Unit
    statements: list[ast.stmt]
    indent: str | None

    def line_span(self) -> range:
        first = min(_first_line(s) for s in self.statements)
        last = max(s.end_lineno - 1 for s in self.statements)
        return range(first, last + 1)


@dataclass(eq=False)
class TryParts:
    handlers: list[Unit]
    orelse: Unit | None
    final: Unit | None


class PySource:
    """Parsed Python source with units, suites, companions and a name resolver."""

    def __init__(self, text: str):
        self.text = text
        self.tree = ast.parse(text)
        self.lines = split_lines(text)
        self._colon_after = _colon_lines(text)
        self.units: list[Unit] = []
        self.units_on_line: list[list[Unit]] = [[] for _ in self.lines]
        self.header_of: dict[ast.AST, Unit] = {}
        self.suites: list[Suite] = []
        self.companions: dict[Unit, list[Unit]] = {}  # compound header → its clause headers
        self.try_parts: dict[Unit, TryParts] = {}  # try header → its clauses (the grammar needs some)
        self.match_cases: dict[Unit, list[Unit]] = {}  # match header → case clauses (one must stay)
        self.function_returns: dict[Unit, list[Unit]] = {}  # function header → its top-level returns
        self.callers: dict[str, list[Unit]] = {}
        self.module_scope = Scope("module", None)
        self._walk_suite(self.tree.body, parent=None, scope=self.module_scope)
        for unit in self.units:
            for name in unit.calls:
                self.callers.setdefault(name, []).append(unit)

    # ---- queries ---------------------------------------------------------------------------------
    def resolve(self, unit: Unit, name: str) -> list[Unit]:
        """Units binding `name` as seen from `unit`: innermost visible scope, nearest earlier binding."""
        scope, first = unit.scope, True
        while scope is not None:
            if scope.kind != "class" or first:
                found = scope.defs.get(name)
                if found:
                    return [_nearest_before(found, unit.start)]
            scope, first = scope.parent, False
        return []

    def resolve_self_attr(self, unit: Unit, name: str) -> list[Unit]:
        """Methods, class attributes or self.<name> assignments of the class around `unit`."""
        scope = unit.scope
        while scope is not None and scope.kind != "class":
            scope = scope.parent
        if scope is None:
            return []
        return list(scope.defs.get(name, [])) or list(scope.attrs.get(name, []))[:1]

    def enclosing(self, unit: Unit) -> list[Unit]:
        chain, parent = [], unit.parent
        while parent is not None:
            chain.append(parent)
            parent = parent.parent
        return chain

    # ---- construction ----------------------------------------------------------------------------
    def _add(self, unit: Unit) -> Unit:
        self.units.append(unit)
        for line in unit.lines:
            self.units_on_line[line].append(unit)
        return unit

    def _walk_suite(self, statements: list[ast.stmt], parent: Unit | None, scope: Scope) -> None:
        for stmt in statements:
            if isinstance(stmt, _COMPOUND):
                self._compound(stmt, parent, scope)
            else:
                unit = self._add(Unit("statement", stmt.lineno - 1, stmt.end_lineno - 1, stmt, parent, scope))
                _collect_uses(unit, stmt)
                self._bind_statement(unit, stmt, scope)

    def _suite(self, intro: Unit, statements: list[ast.stmt], scope: Scope) -> None:
        if not statements:
            return
        first = statements[0]
        indent = None
        if first.lineno - 1 > intro.end:
            indent = indentation(self.lines[first.lineno - 1])
        self.suites.append(Suite(intro, statements, indent))
        self._walk_suite(statements, intro, scope)

    def _compound(self, node: ast.stmt, parent: Unit | None, scope: Scope) -> None:
        start = _first_line(node)
        header = self._add(Unit("header", start, self._colon_after[node.lineno - 1], node, parent, scope))
        self.header_of[node] = header
        for name, value in ast.iter_fields(node):
            if name not in _BODY_FIELDS:
                _collect_uses(header, value)
        body_scope = scope
        if isinstance(node, _FUNCTIONS):
            scope.bind(node.name, header)
            body_scope = Scope("function", scope)
            for arg in _all_args(node.args):
                body_scope.bind(arg, header)
        elif isinstance(node, ast.ClassDef):
            scope.bind(node.name, header)
            body_scope = Scope("class", scope)
        else:
            _bind_targets(header, node, scope)
        self._suite(header, getattr(node, "body", []), body_scope)  # match has cases instead
        clauses: list[Unit] = []
        if isinstance(node, ast.If):
            clauses += self._if_chain(node, header, scope)
        elif isinstance(node, _TRIES):
            clauses += self._try_clauses(node, header, scope)
        elif isinstance(node, ast.Match):
            cases = [self._case(case, header, scope) for case in node.cases]
            clauses += cases
            self.match_cases[header] = cases
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and node.orelse:
            clauses.append(self._keyword_clause("else", node, node.body, node.orelse, header, scope))
        if clauses:
            self.companions[header] = clauses
        if isinstance(node, _FUNCTIONS):
            self.function_returns[header] = [
                u
                for s in node.body
                if isinstance(s, ast.Return)
                for u in self.units_on_line[s.lineno - 1]
                if u.node is s
            ]

    def _if_chain(self, node: ast.If, header: Unit, scope: Scope) -> list[Unit]:
        if not node.orelse:
            return []
        first = node.orelse[0]
        if len(node.orelse) == 1 and isinstance(first, ast.If) and self._is_elif(first):
            # `elif` is a nested If without an `else:` line; its header hangs directly off this header.
            self._compound(first, header, scope)
            inner = self.header_of[first]
            return [inner] + self.companions.get(inner, [])
        return [self._keyword_clause("else", node, node.body, node.orelse, header, scope)]

    def _try_clauses(self, node: ast.stmt, header: Unit, scope: Scope) -> list[Unit]:
        handlers = []
        for handler in node.handlers:
            start = handler.lineno - 1
            unit = self._add(Unit("clause", start, self._colon_after[start], handler, header, scope))
            if handler.type is not None:
                _collect_uses(unit, handler.type)
            if handler.name:
                scope.bind(handler.name, unit)
            self._suite(unit, handler.body, scope)
            handlers.append(unit)
        orelse = final = None
        if node.orelse:
            orelse = self._keyword_clause("else", node, node.handlers[-1].body, node.orelse, header, scope)
        if node.finalbody:
            before = node.orelse or (node.handlers[-1].body if node.handlers else node.body)
            final = self._keyword_clause("finally", node, before, node.finalbody, header, scope)
        self.try_parts[header] = TryParts(handlers, orelse, final)
        return handlers + [c for c in (orelse, final) if c is not None]

    def _case(self, case: ast.match_case, header: Unit, scope: Scope) -> Unit:
        start = case.pattern.lineno - 1
        unit = self._add(Unit("clause", start, self._colon_after[start], case, header, scope))
        _collect_uses(unit, case.pattern)
        if case.guard is not None:
            _collect_uses(unit, case.guard)
        self._suite(unit, case.body, scope)
        return unit

    def _keyword_clause(self, word, owner, before, after, header: Unit, scope: Scope) -> Unit:
        """An `else:`/`finally:` line: the last line between two suites that starts with the keyword."""
        low = max(s.end_lineno for s in before)  # 1-based last line of the preceding suite
        pattern = re.compile(rf"\s*{word}\b")
        start = next(
            (i for i in range(_first_line(after[0]), low - 1, -1) if pattern.match(self.lines[i])),
            None,
        )
        if start is None:
            raise ValueError(f"could not find the '{word}' line of the statement at line {owner.lineno}")
        unit = self._add(Unit("clause", start, self._colon_after[start], owner, header, scope))
        self._suite(unit, after, scope)
        return unit

    def _is_elif(self, node: ast.If) -> bool:
        return self.lines[node.lineno - 1].lstrip().startswith("elif")

    def _bind_statement(self, unit: Unit, stmt: ast.stmt, scope: Scope) -> None:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                if alias.name != "*":
                    scope.bind(alias.asname or alias.name.split(".")[0], unit)
            return
        _bind_targets(unit, stmt, scope)
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            class_scope = _method_class_scope(scope)
            for target in targets:
                for node in ast.walk(target):
                    if _is_self_attr(node) and isinstance(node.ctx, ast.Store) and class_scope is not None:
                        class_scope.attrs.setdefault(node.attr, []).append(unit)


# ---- helpers ---------------------------------------------------------------------------------------
def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno] + [d.lineno for d in decorators]) - 1


def _nearest_before(units: list[Unit], line: int) -> Unit:
    earlier = [u for u in units if u.start <= line]
    return earlier[-1] if earlier else units[0]


def _all_args(args: ast.arguments) -> list[str]:
    every = args.posonlyargs + args.args + args.kwonlyargs
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    return [a.arg for a in every]


def _is_self_attr(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def _collect_uses(unit: Unit, value) -> None:
    roots = value if isinstance(value, list) else [value]
    for root in roots:
        if not isinstance(root, ast.AST):
            continue
        for node in ast.walk(root):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                unit.uses.add(node.id)
            elif _is_self_attr(node) and isinstance(node.ctx, ast.Load):
                unit.self_attrs.add(node.attr)
            elif isinstance(node, ast.Call):
                if isinstance(node.func, ast.Name):
                    unit.calls.add(node.func.id)
                elif isinstance(node.func, ast.Attribute):
                    unit.calls.add(node.func.attr)


def _bind_targets(unit: Unit, node: ast.AST, scope: Scope) -> None:
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in node.items if item.optional_vars is not None]
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                scope.bind(sub.id, unit)
    # walrus targets bind in the enclosing scope; for a compound statement only its header expression counts
    walked = node.test if isinstance(node, (ast.If, ast.While)) else node
    if isinstance(node, (ast.Assign, ast.Expr, ast.Return, ast.If, ast.While)):
        for sub in ast.walk(walked):
            if isinstance(sub, ast.NamedExpr) and isinstance(sub.target, ast.Name):
                scope.bind(sub.target.id, unit)


def _method_class_scope(scope: Scope) -> Scope | None:
    if scope.kind == "function" and scope.parent is not None and scope.parent.kind == "class":
        return scope.parent
    return None


def _colon_lines(text: str) -> list[int]:
    """For every line, the line of the first header-ending colon at or after its start in the same
    logical line (bracket depth 0; a depth-0 lambda consumes its own colon). Otherwise the line itself."""
    result = list(range(len(split_lines(text))))
    depth, lambdas, waiting = 0, 0, []
    for token in tokenize.generate_tokens(io.StringIO(text, newline=None).readline):  # rows as ast counts them
        kind, string, row = token.type, token.string, token.start[0] - 1
        if kind in (tokenize.NEWLINE, tokenize.ENDMARKER):
            depth, lambdas, waiting = 0, 0, []
            continue
        if 0 <= row < len(result) and (not waiting or waiting[-1] != row):
            waiting.append(row)
        if kind != tokenize.OP and not (kind == tokenize.NAME and string == "lambda"):
            continue
        if string in "([{":
            depth += 1
        elif string in ")]}":
            depth -= 1
        elif string == "lambda" and depth == 0:
            lambdas += 1
        elif string == ":" and depth == 0:
            if lambdas:
                lambdas -= 1
                continue
            for waiting_row in waiting:
                result[waiting_row] = row
            waiting = []
    return result
