"""Orthogonal matching pursuit on the masses: attention matching's slower, better key selection, as the paper's
reference code runs it (`compaction/algorithms/omp.py`, `OMPCompaction` with its best configuration).

Each query's exp-scores in units of its largest, E `[m, n]` (E_qi = exp(s_qi − max_q)), and its mass y = E·1: keys
are picked greedily by their unnormalised correlation with the mass still missing, Eᵀ(y − E_S w), a few at a time;
after each pick the weights of the picked keys are refitted (the reference's least squares clamped into [1e-12, e⁷]).
Once t are picked, keys whose log-weight fell below the floor are dropped for good and others picked in their place,
at most three times. The Cholesky factor of the normal equations E_Sᵀ E_S grows by the new columns only, so a pick
costs one pass over E and a refit a triangular solve.
"""

from __future__ import annotations

import math

import torch

from vkv.compress.nnls import JITTER

LOW, HIGH = 1e-12, math.exp(7)  # the reference's box on a picked key's weight
DROP = -7.0  # a picked key whose log-weight ends below this is dropped and replaced
ROUNDS = 3  # at most this many rounds of dropping


def omp_keys(
    queries: torch.Tensor, keys: torch.Tensor, log_max: torch.Tensor, mass: torch.Tensor, t: int, per_step: int = 1
) -> torch.Tensor:
    """The entries OMP keeps for one row, ascending `[c]` with c ≤ t (fewer only when drops exhaust the span):
    `queries` `[m, D]` scaled and post-RoPE, `keys` `[n, D]`, each query's largest score `log_max` `[m]` and mass
    `mass` `[m]` over the span (compaction.row_stats); `per_step` keys picked per refit (the reference's k_choice)."""
    n = keys.shape[0]
    e = (queries.float() @ keys.float().T - log_max[:, None]).exp()  # [m, n], every entry in (0, 1]
    y = mass.double()
    device = keys.device
    chosen = torch.empty(0, dtype=torch.long, device=device)
    factor = torch.empty(0, 0, dtype=torch.float64, device=device)  # lower Cholesky factor of E_Sᵀ E_S
    rhs = torch.empty(0, dtype=torch.float64, device=device)  # E_Sᵀ y
    out = torch.zeros(n, dtype=torch.bool, device=device)  # picked or dropped: no longer a candidate
    current = torch.zeros_like(y)
    rounds = 0
    while True:
        while len(chosen) < t:
            take = min(per_step, n - int(out.sum()), t - len(chosen))
            if take == 0:
                break
            correlation = (e.T @ (y - current).float()).masked_fill(out, float("-inf"))
            picks = correlation.topk(take).indices
            factor, rhs = _grow(e, chosen, picks, factor, rhs, y)
            chosen = torch.cat([chosen, picks])
            out[picks] = True
            current = e[:, chosen].double() @ _weights(factor, rhs)
        rounds += 1
        if rounds > ROUNDS or not len(chosen):
            break
        keep = _weights(factor, rhs).log() >= DROP
        if bool(keep.all()):
            break
        gram = (factor @ factor.T)[keep][:, keep]  # dropped keys stay out of the candidates
        chosen, rhs = chosen[keep], rhs[keep]
        factor = torch.linalg.cholesky(
            gram + JITTER * gram.diagonal().mean() * torch.eye(len(chosen), dtype=gram.dtype, device=device)
        )
        current = e[:, chosen].double() @ _weights(factor, rhs) if len(chosen) else torch.zeros_like(y)
    return chosen.sort().values


def _weights(factor: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """The picked keys' weights `[c]`: least squares from the normal equations' factor, clamped into the box."""
    return torch.cholesky_solve(rhs[:, None], factor)[:, 0].clamp(LOW, HIGH)


def _grow(
    e: torch.Tensor, chosen: torch.Tensor, picks: torch.Tensor, factor: torch.Tensor, rhs: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Cholesky factor of E_Sᵀ E_S `[c, c]` and E_Sᵀ y `[c]` of `chosen` grown by the columns `picks` (float64);
    a new column (nearly) in the span of the others gets the jitter `solve_normal` would give it."""
    new = e[:, picks].double()  # [m, k]
    below = torch.linalg.solve_triangular(factor, e[:, chosen].double().T @ new, upper=False).T  # [k, c]
    corner = new.T @ new - below @ below.T
    scale = (new * new).sum(0).mean()
    eye = torch.eye(len(picks), dtype=corner.dtype, device=corner.device)
    for jitter in (JITTER, 1e-6, 1e-3):
        tail, info = torch.linalg.cholesky_ex(corner + jitter * scale * eye)
        if int(info) == 0:
            break
    top = torch.cat([factor, factor.new_zeros(len(chosen), len(picks))], 1)
    return torch.cat([top, torch.cat([below, tail], 1)], 0), torch.cat([rhs, new.T @ y])
