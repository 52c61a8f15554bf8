"""Attention matching in closed form (Zweiger et al., "Fast KV Compaction via Attention Matching", 2026), each step as
the paper's reference code takes it (github adamzweiger/compaction, `compaction/algorithms/`).

A span's n entries are replaced, per layer and KV head (a row), by t of its keys with one additive bias β each and
refitted values, so that every reference query keeps (1) the attention mass the whole span drew and (2) the output it
read from it; mixing with the prefix and with later tokens is then unchanged for those queries. Rows are fitted one
at a time in float32 (a row's attention over the span, `[m, n]`, is the largest tensor, held a chunk of queries at a
time); least-squares systems are solved in float64:

- keys: the t with the largest root-mean-square attention over the reference queries (`rms`, the reference's
  highest-attention keys), with the largest mean attention (`mean`), or orthogonal matching pursuit on the masses
  (`omp`, compress/omp.py); how many each row keeps is the head budget's split of the span's (`head_counts`);
- biases: w = exp(β) by bounded non-negative least squares on absolute masses, Σ_j exp(s_qj − max_q) w_j ≈
  Σ_i exp(s_qi − max_q) for every query q (`nnls`: the reference's least squares clamped into its bounds, then its
  projected-gradient steps); the exact NNLS of each query's relative mass (`fit`); a shared log(n / t); or 0;
- values: least squares so that the compact attention P' (biases included) reads the span's outputs, P' V' ≈ O,
  with an optional ridge pulling V' toward the kept entries' own values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vkv.compress.head_budget import per_head_index
from vkv.compress.nnls import bounded_nnls, least_squares, nnls
from vkv.compress.omp import omp_keys
from vkv.kv.segment import MASKED

SELECTIONS = ("rms", "mean", "omp")
BIASES = ("nnls", "fit", "shared", "none")
VALUES = ("refit", "keep")
# The reference's box on w = exp(β) and its projected-gradient steps after the clamped least squares, per selection
# (evaluation/configs/algorithms/best.py: highest-attention keys [e⁻³, e³] and 2 steps; OMP [1e-12, e⁷], none).
NNLS_BOUNDS = {
    "rms": (math.exp(-3), math.exp(3), 2),
    "mean": (math.exp(-3), math.exp(3), 2),
    "omp": (1e-12, math.exp(7), 0),
}
QUERY_CHUNK = 4096  # reference queries whose attention over the span is held at once


@dataclass
class SpanReadout:
    """Reference queries and the span they read, per (layer, KV head) row `r`."""

    queries: torch.Tensor  # [R, m, D] post-RoPE, scaled by 1/sqrt(D)
    keys: torch.Tensor  # [R, n, D] post-RoPE, as cached
    values: torch.Tensor  # [R, n, D]

    @classmethod
    def per_head(cls, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> SpanReadout:
        """Rows from per-head tensors: `queries` `[layers, kv_heads, …, D]` (any number of queries per head),
        `keys` and `values` `[layers, kv_heads, n, D]`; row r = layer × kv_heads + head."""
        rows, (n, dim) = keys.shape[0] * keys.shape[1], keys.shape[2:]
        return cls(queries.reshape(rows, -1, dim), keys.reshape(rows, n, dim), values.reshape(rows, n, dim))

    def rows(self, part: slice) -> SpanReadout:
        """The readout of rows `part` only."""
        return SpanReadout(self.queries[part], self.keys[part], self.values[part])

    def scores(self) -> torch.Tensor:
        return self.queries @ self.keys.transpose(1, 2)  # [R, m, n]

    def attention(self) -> torch.Tensor:
        """Each query's attention over the span `[R, m, n]` (rows sum to 1)."""
        return self.scores().softmax(-1)

    def outputs(self) -> torch.Tensor:
        """What each query reads from the span `[R, m, D]`."""
        return self.attention() @ self.values

    def log_mass(self) -> torch.Tensor:
        """log Σ_j exp(q·k_j) per query `[R, m]`: the span's share of attention before normalising."""
        return self.scores().logsumexp(-1)


@dataclass
class Compaction:
    """t entries per (layer, KV head) row standing for the span."""

    index: torch.Tensor  # [R, t] kept span-relative entries: each row's real ones first, ascending
    bias: torch.Tensor  # [R, t] β added to the entries' logits (−inf: a padding slot of a head-wise budget)
    values: torch.Tensor  # [R, t, D]
    real: torch.Tensor  # [R, t] bool: which slots hold entries

    def keys(self, readout: SpanReadout) -> torch.Tensor:
        return readout.keys.gather(1, self.index[..., None].expand(-1, -1, readout.keys.shape[-1]))

    def outputs(self, queries: torch.Tensor, readout: SpanReadout) -> torch.Tensor:
        """What `queries` `[R, m, D]` read from the compacted entries `[R, m, D]`."""
        scores = queries @ self.keys(readout).transpose(1, 2) + self.bias[:, None, :]
        return scores.softmax(-1) @ self.values

    def log_mass(self, queries: torch.Tensor, readout: SpanReadout) -> torch.Tensor:
        return (queries @ self.keys(readout).transpose(1, 2) + self.bias[:, None, :]).logsumexp(-1)


@dataclass
class RowStats:
    """What one row's m reference queries draw from the whole span of n entries."""

    log_max: torch.Tensor  # [m] each query's largest score over the span
    mass: torch.Tensor  # [m] Σ_i exp(s_qi − log_max_q): the span's mass in units of the query's largest term
    outputs: torch.Tensor  # [m, D] what each query reads from the span
    rms: torch.Tensor  # [n] each entry's root-mean-square attention over the queries
    mean: torch.Tensor  # [n] each entry's mean attention

    def key_scores(self, selection: str) -> torch.Tensor:
        """`[n]`: the mean attention for `mean`, else the RMS (OMP's rows are budgeted by it too)."""
        return self.mean if selection == "mean" else self.rms


def row_stats(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, chunk: int = QUERY_CHUNK) -> RowStats:
    """`RowStats` of `queries` `[m, D]` (scaled, post-RoPE) over `keys`, `values` `[n, D]`, `chunk` queries at a
    time."""
    m, n = queries.shape[0], keys.shape[0]
    log_max, mass, outputs = [], [], []
    total, square = torch.zeros(n), torch.zeros(n)
    for lo in range(0, m, chunk):
        scores = queries[lo : lo + chunk].float() @ keys.float().T
        top = scores.amax(-1, keepdim=True)
        weights = scores.sub_(top).exp_()
        z = weights.sum(-1, keepdim=True)
        attention = weights.div_(z)
        outputs.append(attention @ values.float())
        total += attention.sum(0)
        square += torch.linalg.vector_norm(attention, dim=0).square()
        log_max.append(top[:, 0])
        mass.append(z[:, 0])
    return RowStats(torch.cat(log_max), torch.cat(mass), torch.cat(outputs), (square / m).sqrt(), total / m)


def head_counts(scores: torch.Tensor, t: int, rule: str, cap: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """How the span's entries are split over rows for key scores `[layers, kv_heads, n]` (compress/head_budget.py's
    `rule`, `t` per head on average) → (`counts` `[layers, kv_heads]`, `index` `[layers, kv_heads, max count]`, the
    rule's own choice of each head's entries, real ones first). With `cap` < 1, no head of a rule that moves entries
    between heads keeps more than that share of the span (the reference caps each head at 0.75), unless the mean
    budget itself is larger: a head's entries past its cap are out of the competition."""
    n = scores.shape[-1]
    limit = math.floor(cap * n)
    if rule in ("adaptive", "global") and t <= limit < n:
        beyond = scores.argsort(-1, descending=True)[..., limit:]
        scores = scores.scatter(-1, beyond, float("-inf"))
    index, real = per_head_index(scores, t, rule)
    return real.sum(-1), index


def top_keys(scores: torch.Tensor, count: int) -> torch.Tensor:
    """The `count` entries with the highest `scores` `[n]`, ascending `[count]`."""
    return scores.topk(count).indices.sort().values


def fit_row(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    stats: RowStats,
    index: torch.Tensor,
    selection: str,
    bias: str,
    refit: str,
    ridge: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """β `[c]` and values `[c, D]` of one row's kept entries `index` `[c]` (`queries` `[m, D]`, `keys` and `values`
    `[n, D]`, `stats` their `row_stats`)."""
    scores = queries.float() @ keys[index].float().T  # [m, c]
    if bias in ("nnls", "fit"):
        a = (scores - stats.log_max[:, None]).exp()  # each term in units of its query's largest: at most 1
        if bias == "nnls":
            a64 = a.double()
            w = bounded_nnls(a64.T @ a64, a64.T @ stats.mass.double(), *NNLS_BOUNDS[selection]).float()
        else:  # every query's relative mass weighs the same: Σ_j P_qj w_j ≈ 1
            w = nnls((a / stats.mass[:, None])[None])[0].clamp_min(1e-12)
        beta = w.log()
    elif bias == "shared":
        beta = torch.full((len(index),), math.log(keys.shape[0] / len(index)))
    else:
        beta = torch.zeros(len(index))
    kept = values[index].float()
    if refit == "refit":
        kept = least_squares((scores + beta).softmax(-1), stats.outputs, ridge, kept)
    return beta, kept


def check_options(selection: str, bias: str, values: str, head_budget: str) -> None:
    """Refuse an unknown option, or a combination not implemented, before any work (ValueError)."""
    for name, value, known in (
        ("selection", selection, SELECTIONS),
        ("bias", bias, BIASES),
        ("values", values, VALUES),
    ):
        if value not in known:
            raise ValueError(f"unknown {name} '{value}'; choose one of {', '.join(known)}")
    if selection == "omp" and head_budget == "shared":
        raise ValueError("OMP selection with head budget 'shared' (every head the same tokens) is not implemented")


def compact_rows(
    readout: SpanReadout,
    counts: torch.Tensor,
    selection: str,
    bias: str,
    values: str,
    ridge: float,
    fixed: torch.Tensor | None = None,
    omp_step: int = 1,
    stats: list[RowStats] | None = None,
) -> Compaction:
    """Every row of `readout` compacted to its own `counts` `[R]` entries (or to `fixed` `[R, c]` ones, the same
    for every row of a `shared` budget); `stats` when already computed for these queries."""
    parts = []
    for r in range(readout.keys.shape[0]):
        q, k, v = readout.queries[r], readout.keys[r], readout.values[r]
        row = row_stats(q, k, v) if stats is None else stats[r]
        if fixed is not None:
            index = fixed[r]
        elif selection == "omp":
            index = omp_keys(q, k, row.log_max, row.mass, int(counts[r]), omp_step)
        else:
            index = top_keys(row.key_scores(selection), int(counts[r]))
        parts.append((index, *fit_row(q, k, v, row, index, selection, bias, values, ridge)))
    return pad_rows(parts)


def pad_rows(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> Compaction:
    """One Compaction of rows (index `[c]`, β `[c]`, values `[c, D]`) of different lengths (`concat`'s padding)."""
    return concat(
        [
            Compaction(index[None], beta[None], values[None], torch.ones(1, len(index), dtype=torch.bool))
            for index, beta, values in parts
        ]
    )


def concat(parts: list[Compaction]) -> Compaction:
    """The rows of `parts`, in order, each padded to the widest with copies of its first entry, masked (β = −inf)."""
    width = max(p.index.shape[1] for p in parts)
    out = []
    for p in parts:
        pad = width - p.index.shape[1]
        out.append(
            Compaction(
                torch.cat([p.index, p.index[:, :1].expand(-1, pad)], 1),
                torch.cat([p.bias, torch.full((p.bias.shape[0], pad), MASKED)], 1),
                torch.cat([p.values, p.values[:, :1].expand(-1, pad, -1)], 1),
                torch.cat([p.real, torch.zeros(p.real.shape[0], pad, dtype=torch.bool)], 1),
            )
        )
    return Compaction(*(torch.cat([getattr(p, f) for p in out]) for f in ("index", "bias", "values", "real")))


def compact(
    readout: SpanReadout,
    t: int,
    selection: str = "rms",
    bias: str = "nnls",
    values: str = "refit",
    ridge: float = 0.0,
    head_budget: str = "uniform",
    kv_heads: int = 1,
    head_cap: float = 1.0,
    omp_step: int = 1,
) -> Compaction:
    """The compaction of every row of `readout` (rows are layer-major, `kv_heads` per layer) keeping t entries per
    row on average, split over rows by `head_budget` on the rows' key scores (compress/head_budget.py), no head above
    `head_cap` of the span where entries move between heads."""
    rows, n, _ = readout.keys.shape
    if not 1 <= t <= n:
        raise ValueError(f"cannot keep {t} of {n} entries")
    check_options(selection, bias, values, head_budget)
    stats = [row_stats(readout.queries[r], readout.keys[r], readout.values[r]) for r in range(rows)]
    scores = torch.stack([s.key_scores(selection) for s in stats]).reshape(-1, kv_heads, n)
    counts, index = head_counts(scores, t, head_budget, head_cap)
    fixed = index.reshape(rows, -1) if head_budget == "shared" else None
    return compact_rows(readout, counts.reshape(-1), selection, bias, values, ridge, fixed, omp_step, stats)


def fit_bias(
    queries: torch.Tensor, log_mass: torch.Tensor, keys: torch.Tensor, start: torch.Tensor, iterations: int = 300
) -> torch.Tensor:
    """β `[R, t]` for any t entries with `keys` `[R, t, D]` standing for a span whose mass for `queries` `[R, m, D]`
    is exp(`log_mass`) `[R, m]`: w = exp(β) ≥ 0 by NNLS so that Σ_j w_j exp(q·k_j) ≈ the span's mass for every query,
    starting from w = exp(`start`) `[R, t]`; an entry whose start is −inf (a head-wise mask) stays out, at −inf. (In
    float64: a key far louder than the span would overflow float32.)"""
    out = start.isneginf()
    a = (queries.double() @ keys.double().transpose(1, 2) - log_mass.double()[..., None]).clamp_max(80.0).exp()
    a = a.masked_fill(out[:, None, :], 0.0)  # a zero column has zero gradient: its weight stays at its start, 0
    beta = nnls(a, iterations, start.double().exp()).clamp_min(1e-12).log().float()
    return beta.masked_fill(out, float("-inf"))
