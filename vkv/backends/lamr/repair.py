"""AST-aware repair of a pruned line selection (LaMR §3.4), then rendering with placeholders.

Python (via `ast`), applied to a fixpoint:
- closure (always): a kept line keeps every statement or header it touches whole, so brackets, strings
  and backslash continuations close;
- enclosing (always): every header and clause (else/except/finally/case/elif) around a kept line;
- required (always): a kept `try` keeps a handler or `finally`, a kept `match` keeps a case;
- control_flow: all companion clauses of a kept compound header (elif/else, except/else/finally, cases);
- imports: import statements binding names read on kept lines;
- definitions: def/class headers and short module- or class-level assignments binding names read on kept
  lines (also methods reached through `self.`/`cls.`);
- returns: the top-level `return` statements of a function whose body keeps a line.
Then every suite whose header stays but whose statements all went gets `...` (merged with the placeholder
comment), so the output parses whenever the input did. The three "always" rules are what that promise
rests on; the others can be switched off.

Other languages with an installed tree-sitter grammar get the closure/enclosing analogue (first and last
line of enclosing constructs, bracket partners) and referenced imports, best effort; see tssource.py.
Anything else is rendered with placeholders only.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vkv.backends.lamr.pysource import PySource, Unit
from vkv.backends.lamr.render import render
from vkv.backends.lamr.tssource import TsSource, words_on
from vkv.backends.source.languages import canonical_name
from vkv.backends.source.lines import split_lines
from vkv.backends.source.treesitter import grammar_installed


@dataclass(frozen=True)
class RepairConfig:
    control_flow: bool = True
    imports: bool = True
    definitions: bool = True
    returns: bool = True
    max_definition_lines: int = 3  # longer module-level assignments are not pulled in as definitions


@dataclass
class Repaired:
    kept: list[int]  # 0-based original lines kept verbatim
    added: dict[str, list[int]] = field(default_factory=dict)  # rule → lines it added
    fillers: dict[int, str] = field(default_factory=dict)  # header line → indentation of an `...`
    text: str = ""
    method: str = "none"  # "python-ast", "tree-sitter:<lang>" or "none"


def repair(
    text: str, keep: Iterable[int], language: str | None = "python", config: RepairConfig = RepairConfig()
) -> Repaired:
    """Repair the selection `keep` (0-based lines of `text`) and render the result."""
    n = len(split_lines(text))
    kept = {line for line in keep if 0 <= line < n}
    lang = canonical_name(language)
    if lang == "python":
        source = _parse_python(text)
        if source is not None:
            return _finish(text, lang, *_repair_python(source, kept, config), "python-ast")
    elif grammar_installed(lang):
        return _finish(text, lang, *_repair_tree_sitter(TsSource(text, lang), kept, config), f"tree-sitter:{lang}")
    return _finish(text, lang, kept, {}, {}, "none")


def render_selection(text: str, keep: Iterable[int], language: str | None) -> Repaired:
    """No repair at all: the selected lines with placeholders (the "w/o AST" ablation)."""
    n = len(split_lines(text))
    return _finish(text, canonical_name(language), {k for k in keep if 0 <= k < n}, {}, {}, "none")


def _finish(text, language, kept, added, fillers, method) -> Repaired:
    rendered = render(text, kept, language, fillers)
    return Repaired(sorted(kept), {k: sorted(v) for k, v in added.items()}, fillers, rendered, method)


def _parse_python(text: str) -> PySource | None:
    try:
        return PySource(text)
    except (SyntaxError, ValueError):
        return None  # not parseable Python: nothing structural to repair against


# ---- Python ------------------------------------------------------------------------------------------
Rule = Callable[[PySource, set[int], RepairConfig], set[int]]


def _repair_python(source: PySource, kept: set[int], config: RepairConfig):
    rules: list[tuple[str, Rule]] = [("closure", _closure), ("enclosing", _enclosing), ("required", _required)]
    optional = [
        ("control_flow", _control_flow),
        ("imports", _imports),
        ("definitions", _definitions),
        ("returns", _returns),
    ]
    rules += [(name, rule) for name, rule in optional if getattr(config, name)]
    kept = set(kept)
    added: dict[str, set[int]] = {}
    grew = True
    while grew:
        grew = False
        for name, rule in rules:
            new = rule(source, kept, config) - kept
            if new:
                added.setdefault(name, set()).update(new)
                kept |= new
                grew = True
    return kept, added, _emptied_suites(source, kept)


def _units(source: PySource, kept: set[int]) -> set[Unit]:
    return {unit for line in kept for unit in source.units_on_line[line]}


def _closure(source: PySource, kept: set[int], config: RepairConfig) -> set[int]:
    return {line for unit in _units(source, kept) for line in unit.lines}


def _enclosing(source: PySource, kept: set[int], config: RepairConfig) -> set[int]:
    return {line for unit in _units(source, kept) for outer in source.enclosing(unit) for line in outer.lines}


def _required(source: PySource, kept: set[int], config: RepairConfig) -> set[int]:
    """Clauses the grammar demands: a try needs a handler or finally (a handler if its else stays)."""
    lines: set[int] = set()
    for header, parts in source.try_parts.items():
        if header.start not in kept or any(h.start in kept for h in parts.handlers):
            continue
        else_kept = parts.orelse is not None and parts.orelse.start in kept
        final_kept = parts.final is not None and parts.final.start in kept
        if parts.handlers and (else_kept or not final_kept):
            lines.update(parts.handlers[0].lines)
        elif not final_kept:
            lines.update(parts.final.lines)
    for header, cases in source.match_cases.items():
        if header.start in kept and not any(c.start in kept for c in cases):
            lines.update(cases[0].lines)
    return lines


def _control_flow(source: PySource, kept: set[int], config: RepairConfig) -> set[int]:
    return {
        line
        for header, clauses in source.companions.items()
        if header.start in kept
        for clause in clauses
        for line in clause.lines
    }


def _imports(source: PySource, kept: set[int], config: RepairConfig) -> set[int]:
    lines: set[int] = set()
    for unit in _units(source, kept):
        for name in unit.uses:
            for target in source.resolve(unit, name):
                if isinstance(target.node, (ast.Import, ast.ImportFrom)):
                    lines.update(target.lines)
    return lines


def _definitions(source: PySource, kept: set[int], config: RepairConfig) -> set[int]:
    lines: set[int] = set()
    for unit in _units(source, kept):
        targets = [t for name in unit.uses for t in source.resolve(unit, name)]
        targets += [t for name in unit.self_attrs for t in source.resolve_self_attr(unit, name)]
        for target in targets:
            if _is_named_definition(target) or _is_short_global_assignment(target, config):
                lines.update(target.lines)
    return lines


def _is_named_definition(unit: Unit) -> bool:
    return unit.kind == "header" and isinstance(unit.node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))


def _is_short_global_assignment(unit: Unit, config: RepairConfig) -> bool:
    return (
        unit.kind == "statement"
        and unit.scope.kind in ("module", "class")
        and isinstance(unit.node, (ast.Assign, ast.AnnAssign))
        and len(unit.lines) <= config.max_definition_lines
    )


def _returns(source: PySource, kept: set[int], config: RepairConfig) -> set[int]:
    lines: set[int] = set()
    for header, returns in source.function_returns.items():
        if header.start not in kept or not returns:
            continue
        body = _body_without_docstring(header.node.body)
        span = {line for stmt in body for line in range(stmt.lineno - 1, stmt.end_lineno)}
        if any(line in kept and source.units_on_line[line] for line in span - set(header.lines)):
            lines.update(line for unit in returns for line in unit.lines)
    return lines


def _body_without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    is_doc = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    return body[1:] if is_doc else body


def _emptied_suites(source: PySource, kept: set[int]) -> dict[int, str]:
    """Suites whose header stays but none of whose statements do: they need an `...` to parse."""
    fillers: dict[int, str] = {}
    for suite in source.suites:
        if suite.indent is None or suite.intro.start not in kept:
            continue
        if not any(line in kept and source.units_on_line[line] for line in suite.line_span()):
            fillers[suite.intro.end] = suite.indent
    return fillers


# ---- other languages -------------------------------------------------------------------------------
def _repair_tree_sitter(source: TsSource, kept: set[int], config: RepairConfig):
    kept = set(kept)
    added: dict[str, set[int]] = {}
    grew = True
    while grew:
        grew = False
        steps = [
            ("enclosing", {e for line in kept for e in source.enclosing_lines(line)}),
            ("closure", {p for line in kept for p in source.partners.get(line, ())}),
        ]
        if config.imports:
            steps.append(("imports", source.referenced_imports(words_on(source.lines, kept))))
        for name, lines in steps:
            new = lines - kept
            if new:
                added.setdefault(name, set()).update(new)
                kept |= new
                grew = True
    return kept, added, {}
