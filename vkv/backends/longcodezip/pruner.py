"""LongCodeZip as a `TextPruner`: coarse AMI ranking of chunks, fine knapsack over perplexity blocks.

The token budget is a hard cap on the rendered text, placeholders and syntax repairs included: the
selection is rendered, measured with the tokenizer, and redone under another internal budget until
it fits as closely as it can. Model scores are computed once and reused across those rounds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from vkv.backends.base import PruneResult, token_budget
from vkv.backends.longcodezip.budget import greedy_select, retention_ratios
from vkv.backends.longcodezip.chunking import Chunk, ChunkLimits, chunk_document
from vkv.backends.longcodezip.closure import close_kept_lines
from vkv.backends.longcodezip.document import parse_document, parse_messages
from vkv.backends.longcodezip.fine import FineChoice, FineStage, capacity_for
from vkv.backends.longcodezip.render import render
from vkv.backends.longcodezip.scoring import AmiResult, Scorer, ami_scores
from vkv.backends.longcodezip.settings import LongCodeZipSettings
from vkv.backends.longcodezip.tokens import count_tokens, encode, tokenize_lines
from vkv.backends.longcodezip.units import Document
from vkv.backends.source.languages import LANGUAGES, lookup_language
from vkv.errors import VkvError
from vkv.lm.frozen import FrozenLM


@dataclass
class _Selection:
    """One round's choice: which lines survive, and why."""

    mask: np.ndarray
    kept_chunks: list[int]
    ratios: dict[int, float] = field(default_factory=dict)
    choices: dict[int, FineChoice] = field(default_factory=dict)


@dataclass
class _Round:
    """The rendered result of selecting under one internal budget."""

    effective: float
    selection: _Selection
    kept: np.ndarray
    statements: set[int]
    text: str
    produced: int


def _fit_to_budget(attempt, target: int, max_attempts: int) -> tuple[_Round | None, int]:
    """Search the internal budget whose rendered output comes closest to `target` without passing it.

    Placeholders and syntax repairs add tokens and knapsack granularity leaves some unused, so the
    internal budget shrinks after an overshoot (faster each time) and grows into unused slack, then
    bisects between the largest fitting and the smallest overshooting value.
    """
    best: _Round | None = None
    fits_at, over_at = None, None
    effective, overshoots = float(target), 0
    tolerance = max(2, target // 100)
    for attempts in range(1, max_attempts + 1):
        result = attempt(effective)
        if result.produced <= target:
            if best is None or result.produced > best.produced:
                best = result
            fits_at = effective
            if target - result.produced <= tolerance or effective <= 0:
                return best, attempts
        else:
            if effective <= 0:
                break  # nothing left to remove
            over_at = effective
            overshoots += 1
        if fits_at is not None and over_at is not None:
            if over_at - fits_at <= 1:
                return best, attempts
            effective = (fits_at + over_at) // 2
        elif over_at is None:
            effective += target - result.produced  # grow into the slack
        else:
            effective = max(0.0, effective - (result.produced - target) * 2 ** (overshoots - 1))
    if best is None and (over_at is None or over_at > 0):
        result = attempt(0.0)  # nothing selected: one placeholder for the whole text
        best = result if result.produced <= target else None
        attempts += 1
    return best, attempts


@dataclass
class _Plan:
    """What one compression computes once and every budget round reuses."""

    doc: Document
    chunks: list[Chunk]
    sizes: list[int]
    ami: AmiResult
    fine: FineStage
    scorers: dict[str, Scorer]
    query_tokens: int
    seconds: float


@dataclass
class _Outcome:
    result: PruneResult
    kept: np.ndarray
    statements: set[int]


class LongCodeZip:
    """Prune code or a transcript for a query to a token budget (measured with `lm.tokenizer`).

    `lm` ranks chunks and values blocks; `line_lm` (default: the same model) scores lines. When both
    are one model, the line scores come out of the ranking pass at no extra cost.
    """

    name = "longcodezip"

    def __init__(self, lm: FrozenLM, line_lm: FrozenLM | None = None, settings: LongCodeZipSettings | None = None):
        self.lm = lm
        self.line_lm = line_lm or lm
        self.settings = settings or LongCodeZipSettings()

    # ---- public API ----------------------------------------------------------------------------
    def prune(
        self,
        text: str,
        query: str,
        *,
        budget: int | None = None,
        ratio: float | None = None,
        language: str | None = None,
    ) -> PruneResult:
        """Prune `text` (in `language`; None means plain text or markdown, e.g. a transcript)."""
        spec = lookup_language(language) if language else LANGUAGES["text"]
        return self._prune(parse_document(text, spec), query, budget, ratio).result

    def prune_messages(
        self,
        messages: list[str],
        query: str,
        *,
        budget: int | None = None,
        ratio: float | None = None,
        language: str = "markdown",
    ) -> PruneResult:
        """Prune a conversation: each message is a coarse chunk, its paragraphs and code fences the
        fine units. The budget covers the messages joined by newlines; `report["messages"]` holds
        each message's pruned text (a wholly removed message becomes a single placeholder line)."""
        doc = parse_messages(messages, lookup_language(language))
        outcome = self._prune(doc, query, budget, ratio)
        texts = []
        for message, (start, end) in zip(messages, doc.messages or []):
            text = render(doc, outcome.kept, outcome.statements, start, end)
            texts.append(text if message.endswith("\n") or not text.endswith("\n") else text[:-1])
        outcome.result.report["messages"] = texts
        return outcome.result

    # ---- the algorithm ---------------------------------------------------------------------------
    def _prune(self, doc: Document, query: str, budget: int | None, ratio: float | None) -> _Outcome:
        started = time.perf_counter()
        tokenizer = self.lm.tokenizer
        original = count_tokens(tokenizer, doc.text)
        target = token_budget(original, budget, ratio)
        if not query or not query.strip():
            raise VkvError("the query is empty; give the question or request the compressed text must serve")
        report = self._base_report(doc, target)
        if not doc.text.strip():
            return self._unchanged(doc, original, report, "empty input")
        if original <= target:
            return self._unchanged(doc, original, report, "already within budget")

        plan = self._plan(doc, query, target)
        best, attempts = _fit_to_budget(partial(self._attempt, plan), target, self.settings.max_attempts)
        if best is None:  # even a lone placeholder is too long for this budget
            empty = np.zeros(len(doc.lines), dtype=bool)
            best = _Round(0, _Selection(empty, []), empty, set(), "", 0)
        report.update(self._pruned_report(plan, best, attempts, started))
        result = PruneResult(best.text, np.flatnonzero(best.kept).tolist(), original, best.produced, report)
        return _Outcome(result, best.kept, best.statements)

    def _plan(self, doc: Document, query: str, target: int) -> _Plan:
        """Everything model-dependent, computed once: chunks, their AMI, and the fine stage's inputs."""
        started = time.perf_counter()
        s, tokenizer = self.settings, self.lm.tokenizer
        line_tokens = tokenize_lines(tokenizer, doc.lines).tokens_per_line()
        # Chunks that could never be selected whole (above the coarse budget) are split up front.
        piece_limit = max(1, int(self._coarse_budget(target, int(line_tokens.sum()))))
        chunks = chunk_document(doc, line_tokens, ChunkLimits(s.max_chunk_tokens, piece_limit))
        sizes = [int(line_tokens[c.start : c.end].sum()) for c in chunks]
        chunk_tokens = [tokenize_lines(tokenizer, doc.lines[c.start : c.end]) for c in chunks]
        query_ids, separator = encode(tokenizer, query), encode(tokenizer, s.separator)
        coarse = self._scorer(self.lm)
        share_lines = self.line_lm is self.lm and not s.rank_only
        ami = ami_scores(coarse, [t.ids for t in chunk_tokens], query_ids, separator, keep_context_nll=share_lines)
        shared = {i: (chunk_tokens[i], nll) for i, nll in enumerate(ami.context_nll) if nll is not None}
        scorers = {"coarse": coarse, "lines": self._scorer(self.line_lm), "blocks": self._scorer(self.lm)}
        fine = FineStage(
            doc,
            line_tokens,
            s.alpha,
            s.knapsack_resolution,
            scorers["blocks"],
            scorers["lines"],
            query_ids,
            separator,
            shared,
        )
        return _Plan(doc, chunks, sizes, ami, fine, scorers, len(query_ids), time.perf_counter() - started)

    def _attempt(self, plan: _Plan, effective: float) -> _Round:
        """Select under an internal budget, repair the syntax, render, and measure."""
        selection = self._select(plan.chunks, plan.sizes, plan.ami.scores, effective, plan.fine)
        kept, statements = close_kept_lines(plan.doc, selection.mask)
        text = render(plan.doc, kept, statements)
        return _Round(effective, selection, kept, statements, text, count_tokens(self.lm.tokenizer, text))

    def _coarse_budget(self, effective: float, total: int) -> float:
        """What the coarse stage may select: the budget itself, or more when the fine stage will cut."""
        if self.settings.rank_only:
            return effective
        return min(total, effective / self.settings.fine_keep)

    def _select(
        self, chunks: list[Chunk], sizes: list[int], scores: list[float], effective: float, fine: FineStage
    ) -> _Selection:
        kept_chunks = greedy_select(scores, sizes, self._coarse_budget(effective, sum(sizes)))
        selection = _Selection(np.zeros(len(fine.doc.lines), dtype=bool), kept_chunks)
        s = self.settings
        whole = [i for i in kept_chunks if s.rank_only or chunks[i].line_count < s.min_fine_lines]
        for i in whole:
            selection.mask[chunks[i].start : chunks[i].end] = True
        pruned = [i for i in kept_chunks if i not in whole]
        if not pruned:
            return selection
        fine_target = effective - sum(sizes[i] for i in whole)
        ratios = retention_ratios([scores[i] for i in pruned], [sizes[i] for i in pruned], fine_target, s.beta)
        capacities = {i: capacity_for(r, sizes[i]) for i, r in zip(pruned, ratios) if r < 1.0}
        fine.prepare({i: (chunks[i], capacity) for i, capacity in capacities.items()})
        for i, r in zip(pruned, ratios):
            chunk = chunks[i]
            selection.ratios[i] = r
            if r >= 1.0:
                selection.mask[chunk.start : chunk.end] = True
                continue
            choice = fine.select(i, chunk, capacities[i])
            selection.choices[i] = choice
            selection.mask[chunk.start : chunk.end] |= choice.kept
        return selection

    def _scorer(self, lm: FrozenLM) -> Scorer:
        s = self.settings
        return Scorer(lm, batch_tokens=s.batch_tokens, batch_size=s.batch_size, max_tokens=s.max_score_tokens)

    # ---- reporting -------------------------------------------------------------------------------
    def _base_report(self, doc: Document, target: int) -> dict:
        return {
            "backend": self.name,
            "model": self.lm.name,
            "line_model": self.line_lm.name,
            "language": doc.language.name,
            "lines": len(doc.lines),
            "budget": target,
            "parse_errors": doc.parse_errors,
            "settings": self.settings.as_dict(),
        }

    def _pruned_report(self, plan: _Plan, best: _Round, attempts: int, started: float) -> dict:
        return {
            "status": "pruned",
            "attempts": attempts,
            "effective_budget": int(max(best.effective, 0)),
            "query_tokens": plan.query_tokens,
            "query_nll_bits": plan.ami.query_nll,
            "chunks": self._chunk_report(plan.chunks, plan.sizes, plan.ami.scores, best.selection, plan.fine),
            "model_tokens": {name: scorer.meter.as_dict() for name, scorer in plan.scorers.items()},
            "seconds": {
                "scoring_chunks": round(plan.seconds, 4),
                "total": round(time.perf_counter() - started, 4),
            },
        }

    def _unchanged(self, doc: Document, original: int, report: dict, reason: str) -> _Outcome:
        report.update({"status": "unchanged", "reason": reason, "chunks": []})
        kept = np.ones(len(doc.lines), dtype=bool)
        result = PruneResult(doc.text, list(range(len(doc.lines))), original, original, report)
        return _Outcome(result, kept, set())

    @staticmethod
    def _chunk_report(chunks, sizes, scores, selection: _Selection, fine: FineStage) -> list[dict]:
        rows = []
        kept_chunks = set(selection.kept_chunks)
        for i, chunk in enumerate(chunks):
            row = {
                "index": i,
                "lines": [chunk.start, chunk.end],
                "kind": chunk.kind,
                "name": chunk.name,
                "tokens": sizes[i],
                "ami_bits": round(scores[i], 6),
                "kept": i in kept_chunks,
            }
            if i in selection.ratios:
                row["retention"] = round(selection.ratios[i], 6)
            if i in selection.choices:
                choice, blocks = selection.choices[i], fine.blocks[i]
                values = fine.values.get(i, [None] * len(blocks.spans))  # None: no choice, not valued
                chosen = set(choice.chosen)
                row["capacity"] = choice.capacity
                row["skeleton_tokens"] = blocks.skeleton_tokens
                row["knapsack_bucket"] = choice.bucket
                row["blocks"] = [
                    {
                        "lines": [s, e],
                        "tokens": w,
                        "value_bits": None if v is None else round(v, 6),
                        "kept": b in chosen,
                    }
                    for b, ((s, e), w, v) in enumerate(zip(blocks.spans, blocks.weights, values))
                ]
            rows.append(row)
        return rows
