"""`vkv doctor`: prove a model loads frozen and that gradients reach the input embeddings through it."""

from __future__ import annotations

import time
from typing import Any

import torch

from vkv.lm.frozen import FrozenLM
from vkv.resources import peak_memory_mb, reset_peak_memory

PROBE_TEXT = "The project hashes passwords with bcryptjs and runs its tests with the built-in node:test runner."


def check(lm: FrozenLM) -> dict[str, Any]:
    """One forward and backward pass into `inputs_embeds`; returns timings, gradient norm and memory."""
    reset_peak_memory(lm.device)
    ids = torch.tensor([lm.tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]], device=lm.device)
    embeds = lm.embed(ids).detach().float().requires_grad_(True)
    start = time.perf_counter()
    logits = lm.model(inputs_embeds=embeds.to(lm.dtype)).logits
    loss = torch.nn.functional.cross_entropy(logits[0, :-1].float(), ids[0, 1:])
    loss.backward()
    seconds = time.perf_counter() - start
    grad_norm = float(embeds.grad.norm())
    trainable = sum(p.numel() for p in lm.model.parameters() if p.requires_grad)
    return {
        **lm.describe(),
        "load_seconds": round(lm.load_seconds, 3),
        "probe_tokens": int(ids.shape[1]),
        "probe_loss": round(loss.item(), 4),
        "fwd_bwd_seconds": round(seconds, 3),
        "grad_norm": grad_norm,
        "trainable_parameters": trainable,
        "peak_memory_mb": round(peak_memory_mb(lm.device), 1),
        "ok": bool(torch.isfinite(torch.tensor(grad_norm)) and grad_norm > 0 and trainable == 0),
    }
