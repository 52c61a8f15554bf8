"""Everything that runs the model: query NLL with and without a context (AMI), and per-line NLL.

All numbers are negative log-likelihoods in bits. Sequences go through the model in right-padded
batches with an attention mask; only the positions that are scored go through the LM head.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from vkv.backends.longcodezip.tokens import TokenizedLines
from vkv.errors import VkvError
from vkv.lm.frozen import FrozenLM

LN2 = math.log(2.0)


@dataclass
class TokenMeter:
    """Model work done: forward calls, real tokens fed, and tokens fed including padding."""

    calls: int = 0
    tokens: int = 0
    padded_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"forward_calls": self.calls, "tokens": self.tokens, "padded_tokens": self.padded_tokens}


@dataclass
class AmiResult:
    """AMI(c, q) = NLL(q) − NLL(q | c), mean bits per query token, for each context."""

    scores: list[float]
    query_nll: float  # NLL(q) with no context, bits per token
    context_nll: list[np.ndarray | None] = field(default_factory=list)  # NLL of each context's own tokens


def start_token_id(tokenizer) -> int | None:
    """A token to put before every sequence so that its first real token is scored too."""
    for candidate in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id):
        if candidate is not None:
            return int(candidate)
    return None


class Scorer:
    """Runs one frozen LM over token sequences and returns the NLL of chosen positions."""

    def __init__(self, lm: FrozenLM, batch_tokens: int = 8192, batch_size: int = 16, max_tokens: int = 4096):
        self.lm = lm
        self.batch_tokens = batch_tokens
        self.batch_size = batch_size
        self.max_tokens = max_tokens
        self.meter = TokenMeter()
        self.start = start_token_id(lm.tokenizer)
        pad = lm.tokenizer.pad_token_id
        self.pad = int(pad) if pad is not None else (self.start or 0)
        self.decoder = getattr(lm.model, "model", None) or lm.model.get_decoder()
        self.head = lm.model.get_output_embeddings()
        self.softcap = getattr(lm.model.config, "final_logit_softcapping", None)

    def prefix(self) -> list[int]:
        return [self.start] if self.start is not None else []

    @torch.no_grad()
    def nll(self, rows: list[list[int]], score_from: list[int]) -> list[np.ndarray]:
        """For each row, the NLL (bits) of tokens row[score_from:], each given everything before it.

        Position 0 has nothing before it: asked for, it comes back as NaN.
        """
        results: list[np.ndarray | None] = [None] * len(rows)
        for batch in self._batches(rows):
            hidden = self._forward([rows[i] for i in batch])
            for slot, i in enumerate(batch):
                values = self._position_nll(hidden[slot], rows[i], max(score_from[i], 1))
                results[i] = np.concatenate([[np.nan], values]) if score_from[i] == 0 else values
        return results  # type: ignore[return-value]

    def _batches(self, rows: list[list[int]]) -> list[list[int]]:
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        batches: list[list[int]] = []
        for i in order:
            if len(rows[i]) > self.max_tokens:
                raise VkvError(f"a sequence of {len(rows[i])} tokens exceeds the scoring window of {self.max_tokens}")
            current = batches[-1] if batches else None
            fits = current is not None and len(current) < self.batch_size
            fits = fits and len(rows[i]) * (len(current) + 1) <= self.batch_tokens
            # Rows come shortest first; cap the padding at a quarter of the row length.
            if fits and 4 * len(rows[i]) <= 5 * len(rows[current[0]]):
                current.append(i)
            else:
                batches.append([i])
        return batches

    def _forward(self, rows: list[list[int]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for j, row in enumerate(rows):
            ids[j, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[j, : len(row)] = 1
        self.meter.calls += 1
        self.meter.tokens += int(mask.sum())
        self.meter.padded_tokens += ids.numel()
        device = self.lm.device
        out = self.decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
        return out.last_hidden_state

    def _position_nll(self, hidden: torch.Tensor, row: list[int], first: int, slice_size: int = 512) -> np.ndarray:
        """NLL of row[first:] from the hidden states one position earlier, the LM head in slices."""
        targets = torch.tensor(row[first:], dtype=torch.long, device=hidden.device)
        pieces = []
        for lo in range(first - 1, len(row) - 1, slice_size):
            hi = min(lo + slice_size, len(row) - 1)
            logits = self.head(hidden[lo:hi]).float()
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
            logp = torch.log_softmax(logits, dim=-1)
            target = targets[lo - first + 1 : hi - first + 1]
            pieces.append(-logp.gather(1, target[:, None])[:, 0] / LN2)
        if not pieces:
            return np.zeros(0)
        return torch.cat(pieces).cpu().numpy().astype(np.float64)


def ami_scores(
    scorer: Scorer, contexts: list[list[int]], query: list[int], separator: list[int], keep_context_nll: bool
) -> AmiResult:
    """AMI of every context for the query; all query tokens scored, with the same ids, in both terms.

    With `keep_context_nll`, the same pass also yields the NLL of each context's own tokens (the
    query comes after them, so causality leaves them untouched): the fine stage's line scores for free.
    """
    if not query:
        raise VkvError("the query is empty; give the question or request the compressed text must serve")
    room = scorer.max_tokens - len(scorer.prefix()) - len(separator) - len(query)
    if room < 1:
        raise VkvError(f"the query is {len(query)} tokens, too long for the scoring window of {scorer.max_tokens}")
    tail = separator + query
    rows = [scorer.prefix() + tail] + [scorer.prefix() + ctx[:room] + tail for ctx in contexts]
    first_query = [len(row) - len(query) for row in rows]
    score_from = [first_query[0]] + [len(scorer.prefix()) if keep_context_nll else f for f in first_query[1:]]
    nll = scorer.nll(rows, score_from)
    query_nll = float(nll[0].mean())
    scores, context_nll = [], []
    for ctx, values in zip(contexts, nll[1:]):
        scores.append(query_nll - float(values[-len(query) :].mean()))
        whole = keep_context_nll and len(ctx) <= room
        context_nll.append(values[: len(ctx)] if whole else None)
    return AmiResult(scores, query_nll, context_nll)


def line_nll_from_tokens(token_nll: np.ndarray, tokenized: TokenizedLines) -> np.ndarray:
    """Mean token NLL per line (bits); NaN for a line that owns no scored token."""
    scored = np.isfinite(token_nll)
    lines = tokenized.line_of_token[scored]
    counts = np.bincount(lines, minlength=tokenized.line_count)
    sums = np.bincount(lines, weights=token_nll[scored], minlength=tokenized.line_count)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def token_nll_one_pass(scorer: Scorer, ids: list[int]) -> np.ndarray:
    """NLL of every token given the ones before it: one forward pass per scoring window."""
    prefix = scorer.prefix()
    window = scorer.max_tokens - len(prefix)
    rows = [prefix + ids[lo : lo + window] for lo in range(0, len(ids), window)]
    parts = scorer.nll(rows, [len(prefix)] * len(rows)) if rows else []
    return np.concatenate(parts) if parts else np.zeros(0)


def line_nll_one_pass(scorer: Scorer, tokenized: TokenizedLines) -> np.ndarray:
    """Per-line NLL from one causal pass over the whole chunk (token offsets → lines)."""
    return line_nll_from_tokens(token_nll_one_pass(scorer, tokenized.ids), tokenized)


def line_nll_per_line_passes(scorer: Scorer, tokenized: TokenizedLines) -> np.ndarray:
    """The reference's quadratic method, kept as a baseline: one pass per line over the prefix up to it.

    It feeds the same token ids, so its numbers must equal `line_nll_one_pass` (up to float noise).
    """
    prefix = scorer.prefix()
    out = np.full(tokenized.line_count, np.nan)
    owners = tokenized.line_of_token
    for line in range(tokenized.line_count):
        positions = np.flatnonzero(owners == line)
        if len(positions) == 0:
            continue
        first, last = int(positions[0]), int(positions[-1])
        row = prefix + tokenized.ids[: last + 1]
        values = scorer.nll([row], [len(prefix) + first])[0]
        values = values[np.isfinite(values)]
        out[line] = float(values.mean()) if len(values) else np.nan
    return out
