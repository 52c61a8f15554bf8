"""The fine stage for one kept chunk: perplexity-spike blocks, their AMI values, an exact knapsack.

Per-line NLLs come from one causal pass over the chunk — or from the coarse pass itself when the
ranking and line models are the same, since a context's tokens are scored there before the query.
Each block is valued by AMI(block, q). The chunk's own skeleton (signature, braces) is kept
whenever the chunk is, so the knapsack spends only what is left after it. Blocks are valued only
when the knapsack has a real choice: when every block that fits also fits together (or none fits),
the answer does not depend on the values, and the model passes are skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vkv.backends.longcodezip.blocks import split_blocks
from vkv.backends.longcodezip.chunking import Chunk
from vkv.backends.longcodezip.knapsack import solve_knapsack
from vkv.backends.longcodezip.scoring import Scorer, ami_scores, line_nll_from_tokens, line_nll_one_pass
from vkv.backends.longcodezip.tokens import TokenizedLines, encode, tokenize_lines
from vkv.backends.longcodezip.units import FREE, Document


@dataclass
class ChunkBlocks:
    spans: list[tuple[int, int]]  # absolute line ranges [start, end)
    weights: list[int]  # tokens of each block outside the skeleton
    skeleton: np.ndarray  # bool per line of the chunk: kept whenever the chunk is
    skeleton_tokens: int
    line_nll: np.ndarray  # per line of the chunk, bits (NaN where a line has no scored token)


@dataclass
class FineChoice:
    kept: np.ndarray  # bool per line of the chunk
    capacity: int
    chosen: list[int]  # indices into the chunk's blocks
    bucket: int  # knapsack tokens per DP cell (1 = exact)


class FineStage:
    def __init__(
        self,
        doc: Document,
        line_tokens: np.ndarray,
        alpha: float,
        resolution: int,
        block_scorer: Scorer,
        line_scorer: Scorer,
        query: list[int],
        separator: list[int],
        shared_token_nll: dict[int, tuple[TokenizedLines, np.ndarray]],
    ):
        self.doc = doc
        self.line_tokens = line_tokens
        self.alpha = alpha
        self.resolution = resolution
        self.block_scorer = block_scorer
        self.line_scorer = line_scorer
        self.query = query
        self.separator = separator
        self.shared = shared_token_nll  # chunk index → (its tokens, their NLL) from the coarse pass
        self.blocks: dict[int, ChunkBlocks] = {}
        self.values: dict[int, list[float]] = {}  # AMI(block, q) in bits, for chunks that needed it

    def prepare(self, requests: dict[int, tuple[Chunk, int]]) -> None:
        """Blocks for every (chunk, capacity) asked about; values, in one batched AMI call, for those
        whose knapsack has a real choice."""
        for i, (chunk, _) in requests.items():
            if i not in self.blocks:
                self.blocks[i] = self._split(i, chunk)
        todo = [i for i, (_, capacity) in requests.items() if i not in self.values and self._has_choice(i, capacity)]
        if not todo:
            return
        flat = [(i, span) for i in todo for span in self.blocks[i].spans]
        tokenizer = self.block_scorer.lm.tokenizer
        texts = [encode(tokenizer, "".join(self.doc.lines[s:e])) for _, (s, e) in flat]
        scores = ami_scores(self.block_scorer, texts, self.query, self.separator, keep_context_nll=False).scores
        for i in todo:
            self.values[i] = [score for (owner, _), score in zip(flat, scores) if owner == i]

    def select(self, index: int, chunk: Chunk, capacity: int) -> FineChoice:
        """Keep the chunk's skeleton, then the most valuable blocks that fit in what remains."""
        blocks = self.blocks[index]
        values = _positive(self.values[index]) if index in self.values else np.ones(len(blocks.spans))
        solution = solve_knapsack(values, blocks.weights, capacity - blocks.skeleton_tokens, self.resolution)
        kept = blocks.skeleton.copy()
        for b in solution.chosen:
            s, e = blocks.spans[b]
            kept[s - chunk.start : e - chunk.start] = True
        return FineChoice(kept, capacity, solution.chosen, solution.bucket)

    def _has_choice(self, index: int, capacity: int) -> bool:
        blocks = self.blocks[index]
        room = capacity - blocks.skeleton_tokens
        fitting = [w for w in blocks.weights if 0 < w <= room]
        return sum(fitting) > room

    def _split(self, index: int, chunk: Chunk) -> ChunkBlocks:
        line_nll = self._line_nll(index, chunk)
        relative = split_blocks(line_nll, self._can_start(chunk), self.alpha)
        spans = [(chunk.start + s, chunk.start + e) for s, e in relative]
        skeleton = np.zeros(chunk.line_count, dtype=bool)
        if chunk.head is not None:
            skeleton |= np.asarray(self.doc.owner[chunk.start : chunk.end]) == chunk.head
        tokens = self.line_tokens[chunk.start : chunk.end]
        weights = []
        for s, e in spans:
            inside = slice(s - chunk.start, e - chunk.start)
            weights.append(int(tokens[inside][~skeleton[inside]].sum()))
        return ChunkBlocks(spans, weights, skeleton, int(tokens[skeleton].sum()), line_nll)

    def _line_nll(self, index: int, chunk: Chunk) -> np.ndarray:
        if index in self.shared:
            tokenized, token_nll = self.shared[index]
            return line_nll_from_tokens(token_nll, tokenized)
        tokenized = tokenize_lines(self.line_scorer.lm.tokenizer, self.doc.lines[chunk.start : chunk.end])
        return line_nll_one_pass(self.line_scorer, tokenized)

    def _can_start(self, chunk: Chunk) -> np.ndarray:
        """A block may start on a non-blank line that does not continue the unit of the line above."""
        owners = self.doc.owner[chunk.start : chunk.end]
        can = np.zeros(len(owners), dtype=bool)
        previous = None
        for i, owner in enumerate(owners):
            if owner == FREE:
                continue
            can[i] = owner != previous
            previous = owner
        return can


def _positive(values: list[float]) -> np.ndarray:
    """Block values shifted to be positive, order kept: the chunk earned its budget in the coarse
    stage, so even its least relevant block is worth its tokens when it fits."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return v
    spread = float(v.max() - v.min())
    floor = 0.05 * spread if spread > 0 else 1.0
    return v - v.min() + floor


def capacity_for(ratio: float, size: int) -> int:
    return int(math.floor(ratio * size))
