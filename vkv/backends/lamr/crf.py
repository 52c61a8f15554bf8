"""Batched, masked linear-chain CRF over binary keep/prune tags: forward-algorithm NLL, marginals, Viterbi.

Convention (used identically by every method here): `transitions[i, j]` scores moving from tag i at one
valid position to tag j at the next valid position. Masks may be arbitrary: the chain runs over the valid
positions of each row in order, skipping masked ones, so a row whose code tokens sit in the middle of a
prompt needs no re-packing. A row with no valid position has an empty path: score 0, log-partition 0.
"""

from __future__ import annotations

import torch
from torch import nn

PRUNE, KEEP = 0, 1


class LinearChainCRF(nn.Module):
    def __init__(self, num_tags: int = 2):
        super().__init__()
        self.num_tags = num_tags
        self.transitions = nn.Parameter(torch.zeros(num_tags, num_tags))
        self.start = nn.Parameter(torch.zeros(num_tags))
        self.end = nn.Parameter(torch.zeros(num_tags))

    # ---- likelihood -------------------------------------------------------------------------------
    def nll(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-row negative log-likelihood `[B]` of `tags` `[B, T]` given emissions `[B, T, K]`."""
        mask = mask.bool()
        return self.log_partition(emissions, mask) - self.path_score(emissions, tags, mask)

    def path_score(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Unnormalised score `[B]` of one tag path (emissions + start + transitions + end)."""
        mask = mask.bool()
        batch, length, _ = emissions.shape
        tags = tags.long().clamp(0, self.num_tags - 1)  # masked positions may hold ignore values
        score = emissions.new_zeros(batch)
        previous = torch.zeros(batch, dtype=torch.long, device=emissions.device)
        started = torch.zeros(batch, dtype=torch.bool, device=emissions.device)
        for t in range(length):
            tag = tags[:, t]
            valid = mask[:, t]
            emit = emissions[:, t].gather(1, tag[:, None]).squeeze(1)
            step = torch.where(started, self.transitions[previous, tag], self.start[tag]) + emit
            score = score + torch.where(valid, step, torch.zeros_like(step))
            previous = torch.where(valid, tag, previous)
            started = started | valid
        return score + torch.where(started, self.end[previous], torch.zeros_like(score))

    def log_partition(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log Z `[B]` by the forward algorithm in log space."""
        mask = mask.bool()
        alpha = self._forward_scores(emissions, mask)
        started = mask.any(dim=1)
        log_z = torch.logsumexp(alpha + self.end, dim=1)
        return torch.where(started, log_z, torch.zeros_like(log_z))

    def _forward_scores(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, _ = emissions.shape
        alpha = emissions.new_zeros(batch, self.num_tags)  # placeholder until a row's first valid position
        started = torch.zeros(batch, dtype=torch.bool, device=emissions.device)
        for t in range(length):
            emit = emissions[:, t]
            first = self.start + emit
            onward = torch.logsumexp(alpha[:, :, None] + self.transitions, dim=1) + emit
            new = torch.where(started[:, None], onward, first)
            alpha = torch.where(mask[:, t, None], new, alpha)
            started = started | mask[:, t]
        return alpha

    def marginals(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Posterior tag probabilities `[B, T, K]` (zero at masked positions).

        d log Z / d emission[t, k] is exactly P(y_t = k), so autograd gives forward-backward for free.
        """
        with torch.enable_grad():
            leaf = emissions.detach().requires_grad_(True)
            log_z = self.log_partition(leaf, mask.bool())
            (grad,) = torch.autograd.grad(log_z.sum(), leaf)
        return grad

    # ---- decoding --------------------------------------------------------------------------------
    @torch.no_grad()
    def viterbi(self, emissions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Best tag path `[B, T]` (long); masked positions hold PRUNE."""
        mask = mask.bool()
        batch, length, num_tags = emissions.shape
        device = emissions.device
        best = torch.zeros(batch, num_tags, dtype=emissions.dtype, device=device)
        started = torch.zeros(batch, dtype=torch.bool, device=device)
        identity = torch.arange(num_tags, device=device).expand(batch, -1)
        pointers = []
        for t in range(length):
            emit = emissions[:, t]
            candidates = best[:, :, None] + self.transitions  # [B, from, to]
            onward, came_from = candidates.max(dim=1)
            new = torch.where(started[:, None], onward + emit, self.start + emit)
            valid = mask[:, t, None]
            best = torch.where(valid, new, best)
            # Masked steps and first valid steps point to themselves, so backtracking passes through.
            pointer = torch.where(valid & started[:, None], came_from, identity)
            pointers.append(pointer)
            started = started | mask[:, t]
        last = (best + self.end).argmax(dim=1)
        path = torch.zeros(batch, length, dtype=torch.long, device=device)
        tag = last
        for t in range(length - 1, -1, -1):
            path[:, t] = tag
            tag = pointers[t].gather(1, tag[:, None]).squeeze(1)
        return torch.where(mask, path, torch.full_like(path, PRUNE))
