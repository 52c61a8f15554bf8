"""Rubric-guided labels (LaMR §3.1): per-line semantic and dependency targets from (code, kept lines, score).

semantic: a teacher-kept line scores the document score, any other line 0.
dependency: weight spreads from the kept lines along program-structure edges, as the best product of edge
factors over any path of at least one edge (max-product, Dijkstra order):
- structural edges, factor 1: a statement's enclosing headers and clauses (def/class/if/for/while/with/try
  headers, else/elif/except/finally/case lines) and the companion branches of those compound statements;
- symbol edges, factor `decay` per hop: definitions of the names a unit reads (imports, def/class headers,
  assignments, parameters, `self.<attr>` methods/assignments) and, from a def header, the call sites of
  that function.
Lines are binarised at thresholds. With the defaults (decay 0.5, threshold 0.3) a support line is in the
structural context of a kept line, or one symbol hop away together with its own structural context.

Python is analysed with `ast` (pysource.py). Languages with a tree-sitter grammar installed get the
structural edges that are simple everywhere (enclosing constructs, bracket partners) and referenced
imports as symbol edges (tssource.py); no definitions or call sites. Other text gets no dependency labels.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from vkv.backends.lamr.pysource import PySource, Unit
from vkv.backends.lamr.tssource import TsSource, words_on
from vkv.backends.source.languages import canonical_name
from vkv.backends.source.lines import split_lines
from vkv.backends.source.treesitter import grammar_installed

TARGETS = ("teacher", "semantic", "dependency", "denoised")


@dataclass(frozen=True)
class LabelConfig:
    decay: float = 0.5
    dependency_threshold: float = 0.3
    semantic_threshold: float = 0.5
    call_sites: bool = True


@dataclass(frozen=True)
class RubricLabels:
    """Per-line rubric scores and 0/1 targets (0-based lines)."""

    teacher: list[int]
    semantic_score: list[float]
    dependency_score: list[float]
    semantic: list[int]
    dependency: list[int]
    denoised: list[int]  # teacher ∪ dependency: the teacher's lines plus the support they need (§3.1)
    analysis: str  # "python-ast", "tree-sitter:<lang>" or "none"

    def target(self, name: str) -> list[int]:
        if name not in TARGETS:
            raise KeyError(f"no line labels named '{name}'; there are {', '.join(TARGETS)}")
        return getattr(self, name)


def rubric_labels(
    code: str,
    kept: Iterable[int],
    score: float,
    language: str | None = "python",
    config: LabelConfig = LabelConfig(),
) -> RubricLabels:
    """Labels for `code` whose 0-based lines `kept` a teacher retained with document score `score`."""
    n = len(split_lines(code))
    teacher = [0] * n
    for line in kept:
        if 0 <= line < n:
            teacher[line] = 1
    semantic_score = [float(score) * t for t in teacher]
    dependency_score, analysis = _dependency_scores(code, teacher, float(score), language, config)
    semantic = [int(s >= config.semantic_threshold) for s in semantic_score]
    dependency = [int(d >= config.dependency_threshold) for d in dependency_score]
    denoised = [max(t, d) for t, d in zip(teacher, dependency)]
    return RubricLabels(teacher, semantic_score, dependency_score, semantic, dependency, denoised, analysis)


def _dependency_scores(code, teacher, score, language, config) -> tuple[list[float], str]:
    n = len(teacher)
    lang = canonical_name(language)
    if lang == "python":
        try:
            source = PySource(code)
        except (SyntaxError, ValueError):
            return [0.0] * n, "none"
        return _python_dependency(source, teacher, score, config), "python-ast"
    if grammar_installed(lang):
        return _tree_sitter_dependency(TsSource(code, lang), teacher, score, config), f"tree-sitter:{lang}"
    return [0.0] * n, "none"


def _propagate(seeds: dict, neighbours) -> dict:
    """Best product weight over paths of ≥ 1 edge from the seeds; `neighbours(node)` yields (node, factor)."""
    best = dict(seeds)
    reached: dict = {}
    heap = [(-w, i, node) for i, (node, w) in enumerate(seeds.items())]
    heapq.heapify(heap)
    counter = len(heap)
    while heap:
        negative, _, node = heapq.heappop(heap)
        weight = -negative
        if weight < best.get(node, 0.0):
            continue
        for target, factor in neighbours(node):
            candidate = weight * factor
            if candidate > reached.get(target, 0.0):
                reached[target] = candidate
            if candidate > best.get(target, 0.0):
                best[target] = candidate
                counter += 1
                heapq.heappush(heap, (-candidate, counter, target))
    return reached


def _python_dependency(source: PySource, teacher: list[int], score: float, config: LabelConfig) -> list[float]:
    seeds = {unit: score for i, t in enumerate(teacher) if t for unit in source.units_on_line[i]}

    def neighbours(unit: Unit):
        for outer in source.enclosing(unit):
            yield outer, 1.0
            for clause in source.companions.get(outer, ()):
                yield clause, 1.0
        for name in unit.uses:
            for target in source.resolve(unit, name):
                yield target, config.decay
        for name in unit.self_attrs:
            for target in source.resolve_self_attr(unit, name):
                yield target, config.decay
        if config.call_sites and unit.kind == "header" and hasattr(unit.node, "args"):
            for caller in source.callers.get(unit.node.name, ()):
                if caller is not unit:
                    yield caller, config.decay

    weights = [0.0] * len(teacher)
    for unit, weight in _propagate(seeds, neighbours).items():
        for line in unit.lines:
            weights[line] = max(weights[line], weight)
    return weights


def _tree_sitter_dependency(source: TsSource, teacher: list[int], score: float, config: LabelConfig) -> list[float]:
    seeds = {i: score for i, t in enumerate(teacher) if t}

    def neighbours(line: int):
        for other in source.enclosing_lines(line) | source.partners.get(line, set()):
            yield other, 1.0
        for other in source.referenced_imports(words_on(source.lines, [line])):
            yield other, config.decay

    weights = [0.0] * len(teacher)
    for line, weight in _propagate(seeds, neighbours).items():
        if 0 <= line < len(weights):
            weights[line] = max(weights[line], weight)
    return weights
