"""A synthetic SWE-Pruner-format corpus from local Python sources (by default the standard library).

Each record is a snippet cut from a real file, a query about something in it, and the evidence lines that
answer the query as `kept_frags` (score 1.0):
- function / method: "How does `f` work?" → the whole function (decorators included);
- class: "What is the class `C` for?" → its header, docstring and `__init__`;
- setting: "What is the value of `NAME`?" → the assignment statement;
- errors: "Which exceptions can `f` raise?" → just its `raise` statements (scattered evidence).
Negatives ask about a function of another file: nothing kept, score 0. Each snippet comes with up to
`queries_per_snippet` queries about different targets (and sometimes a negative), so the same code appears
with different kept lines and a pruner can only fit the data by reading the query; with one query per
snippet a small model learns where evidence usually sits instead (the first demo did exactly that).

A snippet is a window of consecutive top-level statements (or of one big class's methods under its
header), preceded by the file's imports that the window uses plus up to two it does not. Only evidence
lines are recorded: imports, enclosing headers, helpers and call sites are never marked, so whatever the
dependency rubric learns comes from labels.py's analysis of the code, not from this builder.
Files are split between train and validation by a hash of their path, so no file feeds both.
"""

from __future__ import annotations

import ast
import hashlib
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from vkv.backends.lamr.records import Record
from vkv.backends.source.lines import split_lines
from vkv.errors import VkvError

_SKIP_PARTS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass(frozen=True)
class CorpusConfig:
    min_lines: int = 12
    max_lines: int = 50
    per_file: int = 3
    queries_per_snippet: int = 2  # the same code under different queries: only the query tells them apart
    negative_fraction: float = 0.15
    unused_imports: int = 2
    max_file_bytes: int = 400_000
    seed: int = 0


@dataclass(frozen=True)
class _Target:
    kind: str
    query: str
    lines: tuple[int, ...]  # 0-based lines in the window text


def default_sources() -> list[Path]:
    return [Path(sysconfig.get_paths()["stdlib"])]


def python_files(sources: list[Path]) -> list[Path]:
    files: list[Path] = []
    for source in sources:
        if source.is_file() and source.suffix == ".py":
            files.append(source)
        elif source.is_dir():
            files += [p for p in source.rglob("*.py") if not (_SKIP_PARTS & set(p.relative_to(source).parts))]
        else:
            raise VkvError(f"corpus source {source} is neither a .py file nor a directory")
    return sorted(set(files))


def is_validation_file(path: Path, val_fraction: float, root: Path | None = None) -> bool:
    """A stable split by a hash of the path (relative to `root` when given, so the split does not depend on
    where the source tree lives)."""
    name = path.relative_to(root) if root is not None and root.is_dir() and path.is_relative_to(root) else path
    digest = hashlib.sha256(str(name).encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32 < val_fraction


def build_corpus(
    files: list[Path], limit: int, config: CorpusConfig = CorpusConfig(), exclude_codes: set[str] | None = None
) -> list[Record]:
    """Up to `limit` records from `files` (visited in a seeded random order).

    A snippet whose code already appeared (here or in `exclude_codes`, e.g. the other split) is skipped:
    the standard library has many near-copies (the codec modules) that would otherwise leak across splits.
    """
    rng = random.Random(config.seed)
    order = list(files)
    rng.shuffle(order)
    foreign_names = _function_names(order[: min(len(order), 200)])
    seen = set(exclude_codes or ())
    records: list[Record] = []
    for path in order:
        if len(records) >= limit:
            break
        for group in _records_from_file(path, config, rng, foreign_names):
            if group[0].code not in seen and len(records) < limit:
                seen.add(group[0].code)
                records += group[: limit - len(records)]
    return records


def _function_names(files: list[Path]) -> list[str]:
    names = set()
    for path in files:
        tree = _parse(path, 400_000)
        if tree is not None:
            names.update(n.name for n in ast.walk(tree[0]) if isinstance(n, ast.FunctionDef) and len(n.name) > 4)
    return sorted(names)


def _parse(path: Path, max_bytes: int):
    try:
        if path.stat().st_size > max_bytes:
            return None
        text = path.read_text(encoding="utf-8")
        return ast.parse(text), text
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None


def _records_from_file(path: Path, config: CorpusConfig, rng: random.Random, foreign: list[str]) -> list[list[Record]]:
    """Per snippet, its records: up to `queries_per_snippet` about different targets, maybe one negative."""
    parsed = _parse(path, config.max_file_bytes)
    if parsed is None:
        return []
    tree, text = parsed
    lines = split_lines(text)
    windows = _windows(tree, config, rng)
    rng.shuffle(windows)
    groups = []
    for window in windows[: config.per_file]:
        snippet = _snippet(tree, lines, window, config, rng)
        if snippet is None:
            continue
        code, offset = snippet
        group = []
        targets = _distinct(_targets(ast.parse(code), split_lines(code), offset), rng)
        for target in targets[: config.queries_per_snippet]:
            group.append(Record(target.query, code, tuple(line + 1 for line in target.lines), 1.0))
        if rng.random() < config.negative_fraction:
            names_here = {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)} | _defined_names(code)
            candidates = [n for n in foreign if n not in names_here and n not in code]
            if candidates:
                group.append(Record(_negative_query(rng.choice(candidates), rng), code, (), 0.0))
        if group:
            groups.append(group)
    return groups


def _distinct(targets: list[_Target], rng: random.Random) -> list[_Target]:
    """Targets in random order, keeping only the first of any that share their evidence lines."""
    rng.shuffle(targets)
    seen, result = set(), []
    for target in targets:
        if target.lines not in seen:
            seen.add(target.lines)
            result.append(target)
    return result


def _defined_names(code: str) -> set[str]:
    tree = ast.parse(code)
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


# ---- windows -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Window:
    start: int  # 0-based first line in the file
    end: int  # exclusive
    class_header: tuple[int, int] | None = None  # lines of an enclosing class header kept above the window


def _span(node: ast.stmt) -> tuple[int, int]:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    return first, node.end_lineno


def _windows(tree: ast.Module, config: CorpusConfig, rng: random.Random) -> list[_Window]:
    body = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom)) and not _is_docstring(s)]
    windows = _consecutive(body, config, None, rng)
    for node in body:
        start, end = _span(node)
        if isinstance(node, ast.ClassDef) and end - start > config.max_lines and node.body:
            header_end = node.body[0].lineno - 1
            members = [s for s in node.body if not _is_docstring(s)]
            windows += _consecutive(members, config, (start, header_end), rng)
    return windows


def _consecutive(statements: list[ast.stmt], config: CorpusConfig, header, rng: random.Random) -> list[_Window]:
    """Windows of consecutive statements, each grown to a random length in [min_lines, max_lines], that
    hold at least one def or class (so a query has something to single out among neighbours)."""
    windows, i = [], 0
    while i < len(statements):
        goal = rng.randint(config.min_lines, config.max_lines)
        start = _span(statements[i])[0]
        j, end = i, _span(statements[i])[1]
        while (
            j + 1 < len(statements) and _span(statements[j + 1])[1] - start <= config.max_lines and end - start < goal
        ):
            j += 1
            end = _span(statements[j])[1]
        chosen = statements[i : j + 1]
        has_def = any(isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for s in chosen)
        if config.min_lines <= end - start <= config.max_lines and has_def:
            windows.append(_Window(start, end, header))
        i = j + 1
    return windows


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _snippet(tree, lines, window: _Window, config: CorpusConfig, rng) -> tuple[str, int] | None:
    """(snippet code, line offset of the window inside it): imports + optional class header + window."""
    body_lines = lines[window.start : window.end]
    header_lines = lines[window.class_header[0] : window.class_header[1]] if window.class_header else []
    used = {
        n.id for n in ast.walk(ast.parse(_dedent_safe("".join(header_lines + body_lines)))) if isinstance(n, ast.Name)
    }
    imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    needed = [s for s in imports if _bound_names(s) & used]
    others = [s for s in imports if s not in needed]
    extra = rng.sample(others, min(config.unused_imports, len(others)))
    chosen = sorted(needed + extra, key=lambda s: s.lineno)
    import_text = "".join("".join(lines[s.lineno - 1 : s.end_lineno]) for s in chosen)
    prefix = import_text + ("\n" if import_text else "") + "".join(header_lines)
    code = prefix + "".join(body_lines)
    if not code.endswith("\n"):
        code += "\n"
    try:
        ast.parse(code)
    except SyntaxError:
        return None
    return code, len(split_lines(prefix))


def _dedent_safe(text: str) -> str:
    """Window text that parses on its own: class members get a dummy class header when needed."""
    try:
        ast.parse(text)
        return text
    except SyntaxError:
        return "class _:\n" + text


def _bound_names(node: ast.stmt) -> set[str]:
    return {(a.asname or a.name).split(".")[0] for a in node.names}


# ---- queries -------------------------------------------------------------------------------------------
_FUNCTION_QUERIES = (
    "How does `{name}` work?",
    "What does the function `{name}` return?",
    "Where is `{name}` implemented?",
    "Show me the implementation of `{name}`.",
    "What arguments does `{name}` take and how are they used?",
)
_METHOD_QUERIES = ("How does `{owner}.{name}` work?", "What does the method `{name}` of `{owner}` do?")
_CLASS_QUERIES = ("What is the class `{name}` for?", "How is a `{name}` object initialised?")
_SETTING_QUERIES = ("What is the value of `{name}`?", "Where is the setting `{name}` defined?")
_RAISE_QUERIES = ("Which exceptions can `{name}` raise?", "When does `{name}` raise an error?")
_NEGATIVE_QUERIES = ("How does `{name}` work?", "Where is `{name}` implemented?", "What does `{name}` return?")


def _negative_query(name: str, rng: random.Random) -> str:
    return rng.choice(_NEGATIVE_QUERIES).format(name=name)


def _targets(tree: ast.Module, lines: list[str], offset: int) -> list[_Target]:
    """Query targets inside the window part of the snippet (lines ≥ offset)."""
    rng = random.Random(len(lines) * 7919 + offset)
    targets: list[_Target] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or node.lineno - 1 < offset:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            targets += _function_targets(node, tree, rng)
        elif isinstance(node, ast.ClassDef):
            targets.append(_class_target(node, rng))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and _owner_of(node, tree) is None:
            names = [
                t.id
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name)
            ]
            if names and node.col_offset == 0:
                span = range(node.lineno - 1, node.end_lineno)
                targets.append(_Target("setting", rng.choice(_SETTING_QUERIES).format(name=names[0]), tuple(span)))
    return targets


def _function_targets(node, tree, rng) -> list[_Target]:
    start, end = _span(node)
    owner = _owner_of(node, tree)
    if owner is not None and not isinstance(owner, ast.ClassDef):
        return []  # nested functions are not addressable by name in a query
    if owner is None:
        query = rng.choice(_FUNCTION_QUERIES).format(name=node.name)
        kind = "function"
    else:
        query = rng.choice(_METHOD_QUERIES).format(owner=owner.name, name=node.name)
        kind = "method"
    targets = [_Target(kind, query, tuple(range(start, end)))]
    raises = [s for s in ast.walk(node) if isinstance(s, ast.Raise) and s.exc is not None]
    if raises:
        label = node.name if owner is None else f"{owner.name}.{node.name}"
        raise_lines = sorted({line for s in raises for line in range(s.lineno - 1, s.end_lineno)})
        targets.append(_Target("errors", rng.choice(_RAISE_QUERIES).format(name=label), tuple(raise_lines)))
    return targets


def _class_target(node: ast.ClassDef, rng) -> _Target:
    start, _ = _span(node)
    header_end = node.body[0].lineno - 1
    lines = set(range(start, max(header_end, node.lineno)))
    if node.body and _is_docstring(node.body[0]):
        lines.update(range(node.body[0].lineno - 1, node.body[0].end_lineno))
    for member in node.body:
        if isinstance(member, ast.FunctionDef) and member.name == "__init__":
            lines.update(range(*_span(member)))
    return _Target("class", rng.choice(_CLASS_QUERIES).format(name=node.name), tuple(sorted(lines)))


def _owner_of(node: ast.AST, tree: ast.Module) -> ast.AST | None:
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if child is node:
                return None if isinstance(parent, ast.Module) else parent
    return None
