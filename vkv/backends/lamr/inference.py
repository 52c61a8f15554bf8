"""From (code, query) to per-line keep scores (LaMR §3.4).

Code longer than the backbone's window is split into overlapping chunks; each chunk's fused emissions are
decoded with Viterbi on the decision CRF (and, for budgeted pruning, turned into posterior keep
probabilities). A token's value is spread over its characters; characters covered by several chunks
average them; a line's keep fraction is the mean over its characters (line endings excluded). Lines at or
above the threshold are kept; blank lines follow their neighbours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from vkv.backends.lamr.crf import KEEP
from vkv.backends.lamr.model import LaMRModel, LaMROutput
from vkv.backends.lamr.prompt import Chunk, CodeTokens, make_chunks, tokenize_code
from vkv.backends.source.lines import LineIndex


@dataclass
class ChunkScores:
    chunk: Chunk
    decisions: np.ndarray  # [code_len] 1 = keep (Viterbi)
    keep_probability: np.ndarray  # [code_len] posterior P(keep)
    relevance: float  # P(yes) of the relevance head


@dataclass
class LineScores:
    keep_fraction: list[float]  # character-weighted mean of Viterbi decisions; NaN on empty lines
    keep_probability: list[float]  # the same for posterior keep probabilities
    relevance: float  # max over chunks
    chunks: int
    code_tokens: int


def pad_token_id(model: LaMRModel) -> int:
    """The id batches are padded with: the tokenizer's pad token, or 0 when it has none."""
    pad = model.tokenizer.pad_token_id
    return 0 if pad is None else int(pad)


def pad_batch(sequences: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and attention mask."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[row, : len(seq)] = 1
    return ids.to(device), mask.to(device)


def code_mask(chunks: list[Chunk], width: int, device) -> torch.Tensor:
    mask = torch.zeros((len(chunks), width), dtype=torch.bool)
    for row, chunk in enumerate(chunks):
        mask[row, chunk.code_start : chunk.code_start + chunk.code_len] = True
    return mask.to(device)


def chunk_scores(model: LaMRModel, output: LaMROutput, chunks: list[Chunk]) -> list[ChunkScores]:
    """Viterbi decisions and keep posteriors of the decision CRF for each chunk's code tokens."""
    fused = output.head.fused.float()
    mask = code_mask(chunks, fused.shape[1], fused.device)
    crf = model.head.decision_crf
    decisions = crf.viterbi(fused, mask).cpu().numpy()
    posteriors = crf.marginals(fused, mask)[..., KEEP].detach().cpu().numpy()
    relevance = output.relevance.detach().cpu().numpy()
    result = []
    for row, chunk in enumerate(chunks):
        span = slice(chunk.code_start, chunk.code_start + chunk.code_len)
        result.append(
            ChunkScores(chunk, decisions[row, span].astype(np.float64), posteriors[row, span], float(relevance[row]))
        )
    return result


@torch.no_grad()
def run_chunks(model: LaMRModel, chunks: list[Chunk], batch_size: int = 4) -> list[ChunkScores]:
    scores: list[ChunkScores] = []
    for start in range(0, len(chunks), batch_size):
        batch = chunks[start : start + batch_size]
        ids, attention = pad_batch([c.input_ids for c in batch], pad_token_id(model), model.device)
        scores += chunk_scores(model, model(ids, attention), batch)
    return scores


def combine(code: str, tokens: CodeTokens, scores: list[ChunkScores]) -> LineScores:
    """Average chunk token values per character, then per line."""
    length = len(code)
    offsets = np.asarray(tokens.offsets, dtype=np.int64).reshape(-1, 2)
    sums = {"decision": np.zeros(length + 1), "probability": np.zeros(length + 1)}
    counts = np.zeros(length + 1)
    for chunk_score in scores:
        chunk = chunk_score.chunk
        starts, ends = offsets[chunk.token_start : chunk.token_end].T
        real = ends > starts
        # difference arrays: +v where a token's characters start, −v where they end; prefix sums later
        for key, values in (("decision", chunk_score.decisions), ("probability", chunk_score.keep_probability)):
            np.add.at(sums[key], starts[real], values[real])
            np.add.at(sums[key], ends[real], -values[real])
        np.add.at(counts, starts[real], 1.0)
        np.add.at(counts, ends[real], -1.0)
    per_char_count = np.cumsum(counts)[:length]
    index = LineIndex.of(code)
    fractions = {}
    for key, diff in sums.items():
        per_char = np.cumsum(diff)[:length]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(per_char_count > 0, per_char / np.maximum(per_char_count, 1), np.nan)
        fractions[key] = [_line_mean(mean, *index.content_span(i)) for i in range(len(index))]
    relevance = max((s.relevance for s in scores), default=0.0)
    return LineScores(fractions["decision"], fractions["probability"], relevance, len(scores), len(tokens.ids))


def _line_mean(per_char: np.ndarray, start: int, end: int) -> float:
    values = per_char[start:end]
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else math.nan


def score_lines(model: LaMRModel, code: str, query: str, batch_size: int = 4) -> LineScores:
    tokens = tokenize_code(model.tokenizer, code)
    chunks = make_chunks(model.tokenizer, tokens, query, model.config.max_length, model.config.chunk_overlap)
    model.eval()
    return combine(code, tokens, run_chunks(model, chunks, batch_size))


def select_lines(code: str, line_values: list[float], threshold: float) -> set[int]:
    """Lines whose value is ≥ threshold; a blank line stays only between two kept lines."""
    lines = LineIndex.of(code).lines
    blank = [not line.strip() for line in lines]
    kept = {i for i, v in enumerate(line_values) if not blank[i] and not math.isnan(v) and v >= threshold}
    next_kept = False  # is the next non-blank line (scanning backwards) kept?
    following: list[bool] = [False] * len(lines)
    for i in range(len(lines) - 1, -1, -1):
        following[i] = next_kept
        if not blank[i]:
            next_kept = i in kept
    previous_kept = False
    for i in range(len(lines)):
        if not blank[i]:
            previous_kept = i in kept
        elif previous_kept and following[i]:
            kept.add(i)
    return kept
