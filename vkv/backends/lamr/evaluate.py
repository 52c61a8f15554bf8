"""End-to-end validation of the whole pruning path: chunks → Viterbi → line keep fractions → threshold →
(optional) AST repair, scored per code token against line references.

A code token counts as kept when its line is kept (the token's line is that of its first non-blank
character) and as relevant when its line is in the reference: `teacher` (the record's kept lines) or
`denoised` (teacher lines plus their dependency support from labels.py). Micro-averaged over all tokens.
Also reported: the fraction of code tokens kept and, for Python, how many rendered outputs parse.
"""

from __future__ import annotations

import ast
import bisect
from dataclasses import dataclass, field

import torch

from vkv.backends.lamr.dataset import EncodedSet
from vkv.backends.lamr.inference import chunk_scores, combine, pad_token_id, run_chunks, select_lines
from vkv.backends.lamr.model import LaMRModel
from vkv.backends.lamr.repair import RepairConfig, render_selection, repair
from vkv.backends.lamr.train import forward, make_batch, prf
from vkv.backends.source.lines import LineIndex


@dataclass
class LineEvaluation:
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # reference → precision/recall/f1
    kept_token_fraction: float = 0.0
    python_parse_rate: float | None = None
    records: int = 0
    kept: list[set[int]] = field(default_factory=list)  # final kept lines per record

    def query_sensitivity(self, records) -> float | None:
        """Among codes evaluated under several queries with different references, the fraction whose
        kept lines differ between queries (0: the pruner ignores the query)."""
        groups: dict[str, list[int]] = {}
        for index, record in enumerate(records):
            groups.setdefault(record.code, []).append(index)
        contrasts = [g for g in groups.values() if len({records[i].kept_frags for i in g}) > 1]
        if not contrasts:
            return None
        return sum(len({frozenset(self.kept[i]) for i in g}) > 1 for g in contrasts) / len(contrasts)


@torch.no_grad()
def evaluate(
    model: LaMRModel,
    encoded: EncodedSet,
    threshold: float | None = None,
    repair_config: RepairConfig | None = RepairConfig(),
    references: tuple[str, ...] = ("teacher", "denoised"),
    batch_size: int = 8,
    autocast: bool = False,
) -> LineEvaluation:
    """Score the pipeline; `repair_config=None` evaluates raw thresholded lines (no AST repair)."""
    model.eval()
    threshold = model.config.threshold if threshold is None else threshold
    per_record = _chunk_scores_by_record(model, encoded, batch_size, autocast)
    counts = {ref: [0, 0, 0] for ref in references}
    kept_tokens = total_tokens = parsed = python_records = 0
    kept_per_record: list[set[int]] = []
    for index, record in enumerate(encoded.records):
        lines = combine(record.code, encoded.tokens[index], per_record.get(index, []))
        kept = select_lines(record.code, lines.keep_fraction, threshold)
        if repair_config is not None:
            result = repair(record.code, kept, record.language, repair_config)
        else:
            result = render_selection(record.code, kept, record.language)
        kept = set(result.kept)
        kept_per_record.append(kept)
        if record.language == "python":
            python_records += 1
            parsed += _parses(result.text)
        token_lines = _token_lines(record.code, encoded.tokens[index].offsets)
        total_tokens += len(token_lines)
        kept_tokens += sum(line in kept for line in token_lines)
        for ref in references:
            gold_lines = encoded.labels[index].target(ref)
            for line in token_lines:
                predicted, gold = line in kept, bool(gold_lines[line])
                counts[ref][0] += predicted and gold
                counts[ref][1] += predicted and not gold
                counts[ref][2] += gold and not predicted
    return LineEvaluation(
        {ref: prf(*c) for ref, c in counts.items()},
        kept_tokens / total_tokens if total_tokens else 0.0,
        parsed / python_records if python_records else None,
        len(encoded.records),
        kept_per_record,
    )


def _chunk_scores_by_record(model, encoded, batch_size, autocast):
    by_record: dict[int, list] = {}
    examples = encoded.examples
    for start in range(0, len(examples), batch_size):
        group = examples[start : start + batch_size]
        chunks = [e.chunk for e in group]
        if all(e.features is not None for e in group):
            batch = make_batch(group, pad_token_id(model), model.device)
            scores = chunk_scores(model, forward(model, batch, autocast), chunks)
        else:
            scores = run_chunks(model, chunks, batch_size)
        for example, score in zip(group, scores):
            by_record.setdefault(example.record, []).append(score)
    return by_record


def _token_lines(code: str, offsets: list[tuple[int, int]]) -> list[int]:
    index = LineIndex.of(code)
    result = []
    for start, end in offsets:
        if end <= start:
            continue
        piece = code[start:end]
        first = start + (len(piece) - len(piece.lstrip())) if piece.strip() else start
        result.append(bisect.bisect_right(index.starts, first) - 1)
    return result


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except SyntaxError:
        return False
    return True
