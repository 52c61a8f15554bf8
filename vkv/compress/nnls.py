"""The least-squares solvers attention matching needs (compress/compaction.py, compress/omp.py): normal equations in
float64, the reference's bounded NNLS on them, and the exact NNLS of relative masses that vkv's own biases use."""

from __future__ import annotations

import torch

JITTER = 1e-9  # relative to the mean diagonal: keeps the normal equations of a rank-deficient design solvable


def least_squares(
    a: torch.Tensor, b: torch.Tensor, ridge: float = 0.0, toward: torch.Tensor | None = None
) -> torch.Tensor:
    """x `[c, k]` minimising ‖a x − b‖² (+ λ‖x − toward‖² with λ = `ridge` × the mean diagonal of aᵀa) for `a` `[m, c]`,
    `b` `[m, k]`: the normal equations in float64 (the reference's lstsq minimiser when a has full column rank)."""
    a64 = a.double()
    gram = a64.T @ a64
    rhs = a64.T @ b.double()
    if ridge > 0 and toward is not None:
        rhs += ridge * gram.diagonal().mean() * toward.double()
    return solve_normal(gram, rhs, ridge).float()


def solve_normal(gram: torch.Tensor, rhs: torch.Tensor, ridge: float = 0.0) -> torch.Tensor:
    """x with (gram + λI) x = rhs for symmetric positive semi-definite `gram` `[c, c]` (float64), λ = max(`ridge`,
    JITTER) × its mean diagonal; a factorisation that still fails (a singular design) is retried with more jitter."""
    scale = gram.diagonal().mean().clamp_min(1e-300)
    eye = torch.eye(gram.shape[0], dtype=gram.dtype)
    for jitter in (max(ridge, JITTER), 1e-6, 1e-3):
        factor, info = torch.linalg.cholesky_ex(gram + jitter * scale * eye)
        if int(info) == 0:
            return torch.cholesky_solve(rhs, factor)
    raise ValueError("the least-squares system of a compacted head is not positive definite (non-finite scores?)")


def bounded_nnls(gram: torch.Tensor, rhs: torch.Tensor, low: float, high: float, steps: int) -> torch.Tensor:
    """The reference's box-constrained NNLS (`_nnls_pg`) from its normal equations, aᵀa `[c, c]` and aᵀy `[c]`
    (float64): the least-squares w clamped into [`low`, `high`], then `steps` projected-gradient steps of size
    1 / ‖a‖₂² → w `[c]`."""
    w = solve_normal(gram, rhs[:, None])[:, 0].clamp(low, high)
    if steps:
        step = 1.0 / largest_eigenvalue(gram[None])[0]
        for _ in range(steps):
            w = (w - step * (gram @ w - rhs)).clamp(low, high)
    return w


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


def largest_eigenvalue(gram: torch.Tensor, steps: int = 30) -> torch.Tensor:
    """Power iteration on symmetric positive semi-definite `[R, t, t]` → `[R]`, rounded up by 1% (a safe step)."""
    v = torch.ones(gram.shape[:2], dtype=gram.dtype) / gram.shape[1] ** 0.5
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
