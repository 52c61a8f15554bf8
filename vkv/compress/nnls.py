"""The least-squares solvers attention matching needs (compress/compaction.py, compress/omp.py), batched over rows:
the reference's bounded NNLS and its least squares from their normal equations, and the exact NNLS of relative masses
that vkv's own biases use.

Precision (compress/precision.py states the rule): the normal equations arrive accumulated in float32 on the model's
device, as the reference computes its designs; they are factorised in float64, a c × c solve that costs little beside
the m × c² products that built them and keeps the factorisation from adding its own float32 error to theirs (a nearly
singular design then needs less jitter)."""

from __future__ import annotations

import torch

JITTER = 1e-9  # relative to the mean diagonal: keeps the normal equations of a rank-deficient design solvable


def solve_normal(
    gram: torch.Tensor,
    rhs: torch.Tensor,
    real: torch.Tensor | None = None,
    ridge: float = 0.0,
    toward: torch.Tensor | None = None,
) -> torch.Tensor:
    """x `[B, c, k]` with (gram + λI) x = rhs (+ λ `toward`) for symmetric positive semi-definite `gram` `[B, c, c]`,
    `rhs` `[B, c, k]`, λ = max(`ridge`, JITTER) × the mean diagonal of each system's `real` `[B, c]` unknowns (all by
    default); an unknown that is not real (a padding slot of a head-wise budget) is 0. A system whose factorisation
    still fails (a singular design) is retried alone with more jitter. Returns float32."""
    gram, rhs = gram.to(torch.float64, copy=True), rhs.double()  # the caller's equations are left as they were
    diagonal = gram.diagonal(dim1=-2, dim2=-1)
    if real is None:
        real = torch.ones(diagonal.shape, dtype=torch.bool, device=gram.device)
    scale = ((diagonal * real).sum(-1) / real.sum(-1).clamp_min(1)).clamp_min(1e-300)  # [B]
    gram.masked_fill_(~real[:, :, None], 0.0).masked_fill_(~real[:, None, :], 0.0)
    diagonal.add_((~real).double() * scale[:, None])  # padding: its own unit system
    rhs = rhs * real[..., None]
    if ridge > 0 and toward is not None:
        rhs = rhs + ridge * scale[:, None, None] * toward.double() * real[..., None]
    out = torch.empty_like(rhs)
    todo = torch.arange(gram.shape[0], device=gram.device)
    added = 0.0
    for jitter in (max(ridge, JITTER), 1e-6, 1e-3):
        diagonal.add_((jitter - added) * scale[:, None])  # only the systems still unsolved are factorised again
        added = jitter
        system = gram if len(todo) == gram.shape[0] else gram[todo]
        factor, info = torch.linalg.cholesky_ex(system)
        solved = info == 0
        out[todo[solved]] = torch.cholesky_solve(rhs[todo[solved]], factor[solved])
        todo, factor = todo[~solved], None
        if not len(todo):
            return out.float()
    raise ValueError("the least-squares system of a compacted head is not positive definite (non-finite scores?)")


def bounded_nnls(
    gram: torch.Tensor, rhs: torch.Tensor, low: float, high: float, steps: int, real: torch.Tensor | None = None
) -> torch.Tensor:
    """The reference's box-constrained NNLS (`_nnls_pg`) from its normal equations, aᵀa `[B, c, c]` and aᵀy `[B, c]`:
    the least-squares w clamped into [`low`, `high`], then `steps` projected-gradient steps of size 1 / ‖a‖₂² → w
    `[B, c]` (the steps in the equations' dtype; float32 out; `real` as `solve_normal`'s, its padding left at `low`)."""
    w = solve_normal(gram, rhs[..., None], real)[..., 0].to(gram.dtype).clamp(low, high)
    if steps:
        step = 1.0 / largest_eigenvalue(gram)[:, None]
        for _ in range(steps):
            w = (w - step * ((gram @ w[..., None])[..., 0] - rhs)).clamp(low, high)
    return w.float()


def nnls(a: torch.Tensor, iterations: int = 300, start: torch.Tensor | None = None) -> torch.Tensor:
    """w ≥ 0 minimising ‖A w − 1‖² for each row batch `A` `[R, m, t]` → `[R, t]` (`nnls_normal` on Aᵀ A and Aᵀ1)."""
    return nnls_normal(a.transpose(1, 2) @ a, a.sum(1), iterations, start)


def nnls_normal(
    gram: torch.Tensor, target: torch.Tensor, iterations: int = 300, start: torch.Tensor | None = None
) -> torch.Tensor:
    """w ≥ 0 minimising ‖A w − y‖² from its normal equations, AᵀA `[R, t, t]` and Aᵀy `[R, t]` (accelerated
    projected gradient from w = 1, which is exact when A's columns are the whole span and y their sum)."""
    step = 1.0 / largest_eigenvalue(gram)[:, None]  # 1 / the gradient's Lipschitz constant
    w = torch.ones_like(target) if start is None else start.clone()
    previous, y = w, w
    for k in range(iterations):
        gradient = (gram @ y[..., None])[..., 0] - target
        w = (y - step * gradient).clamp_min(0.0)
        y = w + (k / (k + 3)) * (w - previous)
        previous = w
    return w


def largest_eigenvalue(gram: torch.Tensor, steps: int = 30) -> torch.Tensor:
    """Power iteration on symmetric positive semi-definite `[R, t, t]` → `[R]`, rounded up by 1% (a safe step)."""
    v = torch.ones(gram.shape[:2], dtype=gram.dtype, device=gram.device) / gram.shape[1] ** 0.5
    for _ in range(steps):
        v = (gram @ v[..., None])[..., 0]
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    return ((gram @ v[..., None])[..., 0] * v).sum(-1).clamp_min(1e-12) * 1.01


def solve_spd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x with a x = b for symmetric positive definite `a` `[batch, n, n]` and `b` `[batch, n, k]`, by Cholesky.

    Not `torch.linalg.solve`: on CPU builds with MKL, its batched LU returns garbage, or fails on its pivots, for
    batches of a few hundred-row systems when torch runs more than one thread (tests/test_anchors.py holds such a
    case); Cholesky is right for these systems and cheaper."""
    return torch.cholesky_solve(b, torch.linalg.cholesky(a))
