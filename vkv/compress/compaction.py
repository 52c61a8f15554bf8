"""Attention matching in closed form (Zweiger et al., "Fast KV Compaction via Attention Matching", 2026).

A span's n entries are replaced, per layer and KV head, by t of its keys with one additive bias each and refitted
values, so that every reference query keeps (1) the attention mass the whole span drew and (2) the output it read
from it. Then mixing with the prefix and with later tokens is unchanged for those queries. Everything runs batched
over the flattened (layer, KV head) axis, in float32:

- keys: the t the reference queries attend to most (`attention`), or orthogonal matching pursuit on the masses
  (`omp`: greedily the key that best explains the mass still missing, weights refitted after each pick);
- biases: β = log w with w ≥ 0 from non-negative least squares, Σ_j P_ij w_j ≈ 1 for every query i, where P is
  the query's attention over the whole span (so the kept entries reproduce its mass), or a shared log(n / t), or 0;
- values: least squares so the compact attention P' reads the span's outputs, P' V' ≈ O, with a ridge pulling V'
  toward the kept entries' own values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.head_budget import per_head_index
from vkv.kv.segment import MASKED

SELECTIONS = ("attention", "omp")
BIASES = ("fit", "shared", "none")
VALUES = ("refit", "keep")


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

    index: torch.Tensor  # [R, t] kept span-relative entries, ascending
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


def compact(
    readout: SpanReadout,
    t: int,
    selection: str = "attention",
    bias: str = "fit",
    values: str = "refit",
    ridge: float = 1e-2,
    iterations: int = 300,
    head_budget: str = "uniform",
    kv_heads: int = 1,
) -> Compaction:
    """The compaction of every row of `readout` (rows are layer-major, `kv_heads` per layer) keeping t entries per
    row, or t per row on average over a layer's heads with `head_budget="adaptive"` (compress/head_budget.py).

    Rows are fitted one layer at a time: every reference query's attention over the span `[rows, m, n]` is the
    largest tensor here, and a layer's share of it keeps a long span's compaction within memory; each row's fit
    depends only on its own layer (the shared head budget's choice, over all layers, is made first)."""
    rows, n, _ = readout.keys.shape
    if not 1 <= t <= n:
        raise ValueError(f"cannot keep {t} of {n} entries")
    if selection not in SELECTIONS:
        raise ValueError(f"unknown selection '{selection}'; choose one of {', '.join(SELECTIONS)}")
    if selection == "omp" and head_budget != "uniform":
        raise ValueError(f"head budget '{head_budget}' with OMP selection is not implemented")
    if bias not in BIASES:
        raise ValueError(f"unknown bias '{bias}'; choose one of {', '.join(BIASES)}")
    if values not in VALUES:
        raise ValueError(f"unknown values '{values}'; choose one of {', '.join(VALUES)}")
    layers = [slice(r, min(r + kv_heads, rows)) for r in range(0, rows, kv_heads)]
    if selection == "attention":
        mean_attention = torch.cat([readout.rows(layer).attention().mean(1) for layer in layers])  # [R, n]
        index, real = per_head_index(mean_attention.reshape(-1, kv_heads, n), t, head_budget)
        index, real = index.reshape(rows, -1), real.reshape(rows, -1)
    parts = []
    for layer in layers:
        part = readout.rows(layer)
        attention = part.attention()  # P [kv_heads, m, n]
        weights = None
        if selection == "omp":
            layer_index, weights = omp(attention, t)
            layer_real = torch.ones_like(layer_index, dtype=torch.bool)
        else:
            layer_index, layer_real = index[layer], real[layer]
        parts.append(_fit(part, attention, layer_index, layer_real, weights, bias, values, ridge, iterations, n))
    return Compaction(*(torch.cat([getattr(p, f) for p in parts]) for f in ("index", "bias", "values", "real")))


def _fit(readout, attention, index, real, weights, bias, values, ridge, iterations, n) -> Compaction:
    """The biases and values of the kept entries `index` `[r, t]` of `readout`'s rows (`attention` its P)."""
    if bias == "fit":
        kept = attention.gather(2, index[:, None, :].expand(-1, attention.shape[1], -1)) * real[:, None, :]
        if weights is not None:  # start from OMP's weights or from all ones, whichever fits better
            ones = torch.ones_like(weights)
            worse = mass_error(kept, weights) > mass_error(kept, ones)
            weights = torch.where(worse[:, None], ones, weights)
        beta = nnls(kept, iterations, weights).clamp_min(1e-12).log()
    elif bias == "shared":  # log(n / t) with each row's own count of entries
        beta = (n / real.sum(-1, keepdim=True).float()).log().expand(index.shape).clone()
    else:
        beta = torch.zeros(index.shape)
    kept_values = readout.values.gather(1, index[..., None].expand(-1, -1, readout.values.shape[-1]))
    result = Compaction(index, beta.masked_fill(~real, MASKED), kept_values, real)
    if values == "refit":
        result.values = ridge_values(readout, result, ridge)
    return result


def nnls(a: torch.Tensor, iterations: int = 300, start: torch.Tensor | None = None) -> torch.Tensor:
    """w ≥ 0 minimising ‖A w − 1‖² for each row batch `A` `[R, m, t]` → `[R, t]` (accelerated projected gradient
    from w = 1, which is exact when the kept entries are the whole span)."""
    gram = a.transpose(1, 2) @ a  # [R, t, t]
    target = a.sum(1)  # Aᵀ1 [R, t]
    step = 1.0 / largest_eigenvalue(gram)[:, None]  # 1 / the gradient's Lipschitz constant
    w = torch.ones_like(target) if start is None else start.clone()
    previous, y = w, w
    for k in range(iterations):
        gradient = (gram @ y[..., None])[..., 0] - target
        w = (y - step * gradient).clamp_min(0.0)
        y = w + (k / (k + 3)) * (w - previous)
        previous = w
    return w


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


def mass_error(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """‖A w − 1‖² per row batch `[R]`."""
    return ((a @ w[..., None])[..., 0] - 1.0).pow(2).sum(-1)


def largest_eigenvalue(gram: torch.Tensor, steps: int = 30) -> torch.Tensor:
    """Power iteration on symmetric positive semi-definite `[R, t, t]` → `[R]`, rounded up by 1% (a safe step)."""
    v = torch.ones(gram.shape[:2], dtype=gram.dtype) / gram.shape[1] ** 0.5
    for _ in range(steps):
        v = (gram @ v[..., None])[..., 0]
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    return ((gram @ v[..., None])[..., 0] * v).sum(-1).clamp_min(1e-12) * 1.01


def omp(attention: torch.Tensor, t: int, iterations: int = 30) -> tuple[torch.Tensor, torch.Tensor]:
    """Orthogonal matching pursuit on the masses: t times, keep the entry whose attention column best matches the
    mass still missing (1 − P_S w per query), then refit w ≥ 0 on the kept ones. → (index [R, t], w [R, t])."""
    rows, m, n = attention.shape
    chosen = torch.zeros(rows, n, dtype=torch.bool)
    norms = attention.norm(dim=1).clamp_min(1e-12)  # [R, n]
    index = torch.empty(rows, 0, dtype=torch.long)
    weights = torch.empty(rows, 0)
    residual = torch.ones(rows, m)
    for _ in range(t):
        fit = ((attention * residual[..., None]).sum(1) / norms).masked_fill(chosen, float("-inf"))
        pick = fit.argmax(-1)
        chosen[torch.arange(rows), pick] = True
        index = torch.cat([index, pick[:, None]], dim=1)
        kept = attention.gather(2, index[:, None, :].expand(-1, m, -1))
        weights = nnls(kept, iterations, torch.cat([weights, torch.ones(rows, 1)], dim=1))
        residual = 1.0 - (kept @ weights[..., None])[..., 0]
    order = index.argsort(-1)
    return index.gather(1, order), weights.gather(1, order)


def ridge_values(readout: SpanReadout, compaction: Compaction, ridge: float) -> torch.Tensor:
    """V' = argmin ‖P' V' − O‖² + λ‖V' − V_kept‖², P' the compact attention (with its biases), O the span's
    read-outs; λ = ridge × the mean diagonal of P'ᵀP' (so `ridge` does not depend on the query count)."""
    scores = readout.queries @ compaction.keys(readout).transpose(1, 2) + compaction.bias[:, None, :]
    p = scores.softmax(-1)  # [R, m, t]
    gram = p.transpose(1, 2) @ p
    lam = ridge * gram.diagonal(dim1=1, dim2=2).mean(-1).clamp_min(1e-12)[:, None, None]
    eye = torch.eye(gram.shape[-1])[None]
    rhs = p.transpose(1, 2) @ readout.outputs() + lam * compaction.values
    return solve_spd(gram + lam * eye, rhs)


def solve_spd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x with a x = b for symmetric positive definite `a` `[batch, n, n]` and `b` `[batch, n, k]`, by Cholesky.

    Not `torch.linalg.solve`: on CPU builds with MKL, its batched LU returns garbage, or fails on its pivots, for
    batches of a few hundred-row systems when torch runs more than one thread (tests/test_anchors.py holds such a
    case); Cholesky is right for these systems and cheaper."""
    return torch.cholesky_solve(b, torch.linalg.cholesky(a))
