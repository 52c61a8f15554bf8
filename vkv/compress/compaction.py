"""Attention matching in closed form (Zweiger et al., "Fast KV Compaction via Attention Matching", 2026), each step as
the paper's reference code takes it (github adamzweiger/compaction, `compaction/algorithms/`).

A span's n entries are replaced, per layer and KV head (a row), by t of its keys with one additive bias β each and
refitted values, so that every reference query keeps (1) the attention mass the whole span drew and (2) the output it
read from it; mixing with the prefix and with later tokens is then unchanged for those queries. Every row is fitted at
once on the device the span's K/V are on, in float32 as the reference fits them (scores, attention and the normal
equations of each least-squares step accumulated a chunk of queries at a time, so no row's `[m, n]` attention is held
whole); the small c × c systems are factorised in float64 (compress/nnls.py):

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

from vkv.compress.head_budget import HeadBudget, per_head_index
from vkv.compress.nnls import bounded_nnls, nnls, nnls_normal, solve_normal
from vkv.compress.omp import omp_keys
from vkv.kv.segment import MASKED
from vkv.stages import stage

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
SCORE_ELEMENTS = 2**26  # attention scores held at once (rows × queries × entries): 256 MiB in float32
GRAM_DTYPE = torch.float32  # the reference's; float64 changed no read-out error on the test model (RESULTS)
GRAM_ELEMENTS = 2**26  # normal-equation entries of the rows fitted together (a wider row is fitted alone)


@dataclass
class SpanReadout:
    """Reference queries and the span they read, per (layer, KV head) row `r`."""

    queries: torch.Tensor  # [R, m, D] post-RoPE, scaled by 1/sqrt(D)
    keys: torch.Tensor  # [R, n, D] post-RoPE, as cached
    values: torch.Tensor  # [R, n, D]
    key_bias: torch.Tensor | None = None  # [R, n] biases the span's entries already carry (entries compacted before;
    # −inf on padding), added to every query's logits; a fit's β then stands in for them

    @classmethod
    def per_head(cls, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> SpanReadout:
        """Rows from per-head tensors: `queries` `[layers, kv_heads, …, D]` (any number of queries per head),
        `keys` and `values` `[layers, kv_heads, n, D]`; row r = layer × kv_heads + head."""
        rows, (n, dim) = keys.shape[0] * keys.shape[1], keys.shape[2:]
        return cls(queries.reshape(rows, -1, dim), keys.reshape(rows, n, dim), values.reshape(rows, n, dim))

    def rows(self, part: torch.Tensor | slice) -> SpanReadout:
        """The readout of rows `part` only."""
        bias = None if self.key_bias is None else self.key_bias[part]
        return SpanReadout(self.queries[part], self.keys[part], self.values[part], bias)

    def scores(self) -> torch.Tensor:
        scores = self.queries @ self.keys.transpose(1, 2)  # [R, m, n]
        return scores if self.key_bias is None else scores + self.key_bias[:, None, :]

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

    def rows(self, part: torch.Tensor | slice) -> Compaction:
        """The compaction of rows `part` only, in its order."""
        return Compaction(self.index[part], self.bias[part], self.values[part], self.real[part])

    def to(self, device: torch.device | str) -> Compaction:
        return Compaction(self.index.to(device), self.bias.to(device), self.values.to(device), self.real.to(device))

    def outputs(self, queries: torch.Tensor, readout: SpanReadout) -> torch.Tensor:
        """What `queries` `[R, m, D]` read from the compacted entries `[R, m, D]`."""
        scores = queries @ self.keys(readout).transpose(1, 2) + self.bias[:, None, :]
        return scores.softmax(-1) @ self.values

    def log_mass(self, queries: torch.Tensor, readout: SpanReadout) -> torch.Tensor:
        return (queries @ self.keys(readout).transpose(1, 2) + self.bias[:, None, :]).logsumexp(-1)


@dataclass
class RowStats:
    """What each row's m reference queries draw from the whole span of n entries, every row at once."""

    log_max: torch.Tensor  # [R, m] each query's largest score over the span
    mass: torch.Tensor  # [R, m] Σ_i exp(s_qi − log_max_q): the span's mass in units of the query's largest term
    outputs: torch.Tensor | None  # [R, m, D] what each query reads from the span (None: not asked for)
    rms: torch.Tensor  # [R, n] each entry's root-mean-square attention over the queries
    mean: torch.Tensor  # [R, n] each entry's mean attention

    def key_scores(self, selection: str) -> torch.Tensor:
        """`[R, n]`: the mean attention for `mean`, else the RMS (OMP's rows are budgeted by it too)."""
        return self.mean if selection == "mean" else self.rms

    @classmethod
    def cat(cls, parts: list[RowStats]) -> RowStats:
        """The rows of `parts`, in order."""
        outputs = None if parts[0].outputs is None else torch.cat([p.outputs for p in parts])
        joined = (torch.cat([getattr(p, f) for p in parts]) for f in ("log_max", "mass", "rms", "mean"))
        log_max, mass, rms, mean = joined
        return cls(log_max, mass, outputs, rms, mean)

    def rows(self, part: torch.Tensor | slice) -> RowStats:
        """The statistics of rows `part` only."""
        outputs = None if self.outputs is None else self.outputs[part]
        return RowStats(self.log_max[part], self.mass[part], outputs, self.rms[part], self.mean[part])


def query_chunk(rows: int, width: int) -> int:
    """Queries per chunk so that `rows` rows' scores over `width` entries stay within SCORE_ELEMENTS."""
    return max(1, SCORE_ELEMENTS // max(1, rows * width))


def row_stats(readout: SpanReadout, outputs: bool = True) -> RowStats:
    """`RowStats` of every row of `readout` on its device, a chunk of queries at a time; `outputs=False` leaves out
    what the queries read (only the keys' scores and masses are needed to budget the rows)."""
    queries, keys, values = readout.queries, readout.keys.float(), readout.values.float()
    rows, m, n = queries.shape[0], queries.shape[1], keys.shape[1]
    log_max, mass, read = [], [], []
    total = torch.zeros(rows, n, device=keys.device)
    square = torch.zeros(rows, n, device=keys.device)
    for lo in range(0, m, query_chunk(rows, n)):
        scores = queries[:, lo : lo + query_chunk(rows, n)].float() @ keys.transpose(1, 2)  # [R, c, n]
        if readout.key_bias is not None:
            scores += readout.key_bias[:, None, :].float()
        top = scores.amax(-1, keepdim=True)
        weights = scores.sub_(top).exp_()
        z = weights.sum(-1, keepdim=True)
        attention = weights.div_(z)
        if outputs:
            read.append(attention @ values)
        total += attention.sum(1)
        square += attention.square().sum(1)
        log_max.append(top[..., 0])
        mass.append(z[..., 0])
    read_out = torch.cat(read, 1) if outputs else None
    return RowStats(torch.cat(log_max, 1), torch.cat(mass, 1), read_out, (square / m).sqrt(), total / m)


def head_counts(
    scores: torch.Tensor, t: int, rule: HeadBudget | str, cap: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """How the span's entries are split over rows for key scores `[layers, kv_heads, n]` (compress/head_budget.py's
    `rule`, `t` per head on average) → (`counts` `[layers, kv_heads]`, `index` `[layers, kv_heads, max count]`, the
    rule's own choice of each head's entries, real ones first). With `cap` < 1, no head of a rule that moves entries
    between heads keeps more than that share of the span (the reference caps each head at 0.75), unless the mean
    budget itself is larger: a head's entries past its cap are out of the competition."""
    rule = HeadBudget.of(rule)
    n = scores.shape[-1]
    limit = math.floor(cap * n)
    if rule.moves_entries and t <= limit < n:
        beyond = scores.argsort(-1, descending=True)[..., limit:]
        scores = scores.scatter(-1, beyond, float("-inf"))
    index, real = per_head_index(scores, t, rule)
    return real.sum(-1), index


def top_keys(scores: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's `counts` `[R]` entries with the highest `scores` `[R, n]` → (`index` `[R, max count]` ascending, real
    ones first, padding repeating the row's first; `real` `[R, max count]`)."""
    n = scores.shape[1]
    counts = counts.to(scores.device)
    top = scores.topk(int(counts.max()), dim=-1).indices  # best first
    real = torch.arange(top.shape[1], device=scores.device) < counts[:, None]
    order = torch.where(real, top, top + n).sort(-1).values  # real ones first, ascending
    return torch.where(real, order, order[:, :1]), real


def fit_rows(
    readout: SpanReadout,
    stats: RowStats,
    index: torch.Tensor,
    real: torch.Tensor,
    selection: str,
    bias: str,
    refit: str,
    ridge: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """β `[R, c]` and values `[R, c, D]` of every row's kept entries `index` `[R, c]` (`real` False on padding, whose
    β is −inf and value the row's first), solved for all rows at once: the normal equations are accumulated a chunk
    of queries at a time, so no `[R, m, c]` tensor is held whole. `stats` are the rows' `row_stats` for these
    queries, with their outputs."""
    queries, n = readout.queries, readout.keys.shape[1]
    gather = index[..., None].expand(-1, -1, readout.keys.shape[-1])
    kept_keys = readout.keys.float().gather(1, gather)  # [R, c, D]
    kept_values = readout.values.float().gather(1, gather)

    def chunks():  # (the chunk's scores against the kept keys [R, q, c], its query slice)
        step = query_chunk(*index.shape)
        for lo in range(0, queries.shape[1], step):
            part = slice(lo, lo + step)
            yield queries[:, part].float() @ kept_keys.transpose(1, 2), part

    with stage("β", queries.device):
        beta = _fit_bias(bias, selection, stats, real, chunks, n)
    if refit == "refit":
        with stage("values", queries.device):
            kept_values = _refit_values(beta, real, stats, chunks, ridge, kept_values)
    return beta, kept_values


def _fit_bias(bias: str, selection: str, stats: RowStats, real: torch.Tensor, chunks, n: int) -> torch.Tensor:
    """β `[R, c]` of the kept entries, −inf on padding (`fit_rows`' first step; `chunks()` yields each chunk of
    queries' scores against the kept keys with its slice)."""
    hidden = ~real[:, None, :]
    if bias in ("nnls", "fit"):
        gram, rhs = None, None
        for scores, part in chunks():
            a = (scores - stats.log_max[:, part, None]).exp_().masked_fill_(hidden, 0.0)  # each term ≤ 1
            if bias == "fit":  # every query's relative mass weighs the same: Σ_j P_qj w_j ≈ 1
                a = a / stats.mass[:, part, None]
            a = a.to(GRAM_DTYPE)
            r = a.sum(1) if bias == "fit" else (a * stats.mass[:, part, None]).sum(1)
            gram, rhs = _accumulate(gram, a), r if rhs is None else rhs + r
        if bias == "nnls":
            w = bounded_nnls(gram, rhs, *NNLS_BOUNDS[selection], real=real)
        else:
            w = nnls_normal(gram, rhs).float().clamp_min(1e-12)
        beta = w.log()
    elif bias == "shared":
        beta = (n / real.sum(-1, keepdim=True).float()).log().expand(real.shape).clone()
    else:
        beta = torch.zeros(real.shape, device=real.device)
    return beta.masked_fill(~real, MASKED)


def _accumulate(gram: torch.Tensor | None, a: torch.Tensor) -> torch.Tensor:
    """gram + aᵀa for a chunk of a design `a` `[R, q, c]`, in place: no second `[R, c, c]` is held."""
    return a.transpose(1, 2) @ a if gram is None else gram.baddbmm_(a.transpose(1, 2), a)


def _refit_values(
    beta: torch.Tensor, real: torch.Tensor, stats: RowStats, chunks, ridge: float, kept_values: torch.Tensor
) -> torch.Tensor:
    """Values `[R, c, D]`: least squares of the compact attention (β included) onto the span's read-outs, pulled
    toward `kept_values` by `ridge` (`fit_rows`' second step); padding keeps the row's first."""
    gram, rhs = None, None
    for scores, part in chunks():
        p = (scores + beta[:, None, :]).softmax(-1).to(GRAM_DTYPE)
        r = p.transpose(1, 2) @ stats.outputs[:, part].to(GRAM_DTYPE)
        gram, rhs = _accumulate(gram, p), r if rhs is None else rhs + r
    return torch.where(real[..., None], solve_normal(gram, rhs, real, ridge, kept_values), kept_values[:, :1])


def check_options(selection: str, bias: str, values: str, head_budget: HeadBudget) -> None:
    """Refuse an unknown option, or a combination not implemented, before any work (ValueError)."""
    for name, value, known in (
        ("selection", selection, SELECTIONS),
        ("bias", bias, BIASES),
        ("values", values, VALUES),
    ):
        if value not in known:
            raise ValueError(f"unknown {name} '{value}'; choose one of {', '.join(known)}")
    if selection == "omp" and not head_budget.per_head:
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
    stats: RowStats | None = None,
) -> Compaction:
    """Every row of `readout` compacted to its own `counts` `[R]` entries (or to `fixed` `[R, c]` ones, the same
    for every row of a `shared` budget), rows of similar counts fitted together (`row_groups`; OMP picks each row's
    keys in turn); `stats` when already computed for these queries, with their outputs."""
    if stats is None:
        with stage("statistics", readout.keys.device):
            stats = row_stats(readout)
    widths = [fixed.shape[1]] * len(counts) if fixed is not None else counts.tolist()
    parts, order = [], []
    for group in row_groups(widths):
        rows = torch.tensor(group, device=readout.keys.device)
        part, part_stats = readout.rows(rows), stats.rows(rows)
        with stage("selection", rows.device):
            if fixed is not None:
                index = fixed.to(rows.device)[rows]
                real = torch.ones(index.shape, dtype=torch.bool, device=index.device)
            elif selection == "omp":
                chosen = zip(part.queries, part.keys, part_stats.log_max, part_stats.mass, (widths[r] for r in group))
                index, real = pad_index([omp_keys(q, k, top, mass, c, omp_step) for q, k, top, mass, c in chosen])
            else:
                index, real = top_keys(part_stats.key_scores(selection), counts[group])
        beta, kept = fit_rows(part, part_stats, index, real, selection, bias, values, ridge)
        parts.append(Compaction(index, beta, kept, real))
        order.extend(group)
    return concat(parts).rows(torch.tensor(order).argsort())


def row_groups(widths: list[int], limit: int = GRAM_ELEMENTS) -> list[list[int]]:
    """Rows fitted together: in decreasing width (entries kept), a group takes the next row while its padded normal
    equations (rows × widest²) stay within `limit` elements and within twice what its rows' own need."""
    groups: list[list[int]] = []
    widest = need = 0
    for r in sorted(range(len(widths)), key=lambda r: -widths[r]):
        square = widths[r] ** 2
        if groups and (len(groups[-1]) + 1) * widest <= min(limit, 2 * (need + square)):
            groups[-1].append(r)
            need += square
        else:
            groups.append([r])
            widest = need = square
    return groups


def pad_index(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of kept entries `[c_r]` of different lengths as `index` `[R, max c]` padded with each row's first, and
    `real` `[R, max c]` (`concat`'s padding)."""
    width = max(len(r) for r in rows)
    index = torch.stack([torch.cat([r, r[:1].expand(width - len(r))]) for r in rows])
    real = torch.arange(width, device=index.device) < torch.tensor([len(r) for r in rows], device=index.device)[:, None]
    return index, real


def concat(parts: list[Compaction]) -> Compaction:
    """The rows of `parts`, in order, each padded to the widest with copies of its first entry, masked (β = −inf)."""
    width = max(p.index.shape[1] for p in parts)
    out = []
    for p in parts:
        pad = width - p.index.shape[1]
        out.append(
            Compaction(
                torch.cat([p.index, p.index[:, :1].expand(-1, pad)], 1),
                torch.cat([p.bias, p.bias.new_full((p.bias.shape[0], pad), MASKED)], 1),
                torch.cat([p.values, p.values[:, :1].expand(-1, pad, -1)], 1),
                torch.cat([p.real, p.real.new_zeros(p.real.shape[0], pad)], 1),
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
    head_budget: HeadBudget | str = HeadBudget.UNIFORM,
    kv_heads: int = 1,
    head_cap: float = 1.0,
    omp_step: int = 1,
) -> Compaction:
    """The compaction of every row of `readout` (rows are layer-major, `kv_heads` per layer) keeping t entries per
    row on average, split over rows by `head_budget` on the rows' key scores (compress/head_budget.py), no head above
    `head_cap` of the span where entries move between heads."""
    head_budget = HeadBudget.of(head_budget)
    rows, n, _ = readout.keys.shape
    if not 1 <= t <= n:
        raise ValueError(f"cannot keep {t} of {n} entries")
    check_options(selection, bias, values, head_budget)
    stats = row_stats(readout)
    scores = stats.key_scores(selection).reshape(-1, kv_heads, n)
    counts, index = head_counts(scores, t, head_budget, head_cap)
    fixed = None if head_budget.per_head else index.reshape(rows, -1)
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
