"""Precision, stated once for every method, and the precision of the activations an optimisation runs in.

The rule, in every dtype users run (fp32, bf16, fp16, 8-bit weights with fp16 or bf16 activations):
- **in the model's dtype**: the model's own activations and every K/V entry it reads or a cache stores, and the
  products of queries with keys and of attention weights with values (as the model computes them): what the model
  computes is what is matched;
- **in float32**: what is added to or normalises attention logits (masks, entry biases β, the softmax's shift and
  normaliser: `lm/kernel.py`'s `attend`), the statistics a fit is built on (each reference query's attention, mass and
  read-out over the span, accumulated a chunk of queries at a time), the normal equations of attention matching's
  least-squares steps (β and the refitted values, `compress/compaction.py`), as the reference builds its designs, and
  the parameters an optimiser moves (virtual embeddings, kvopt's free entries);
- **in float64**: the small c × c factorisations of those normal equations (`compress/nnls.py`) and OMP's growing one
  (`compress/omp.py`), which cost little beside the products that built them; and the design of vkv's bias fit for
  virtual tokens (`compaction.fit_bias`), whose free keys can be far louder than the span's (exp overflows float32).
  Accumulating the equations themselves in float64 changed no read-out
  error on the test model and costs 64× on GPUs without fast float64 (evals/RESULTS.md).

Optimisations run their activations in bf16 where its matmuls are fast (`uses_bf16`), else in the model's dtype."""

from __future__ import annotations

import contextlib

import torch

from vkv.lm.frozen import FrozenLM

PRECISIONS = ("auto", "fp32", "bf16")


def uses_bf16(lm: FrozenLM, precision: str) -> bool:
    """bf16 activations when asked, or by default where bf16 matmuls are fast: CUDA, and CPUs with AMX tiles
    for unquantised weights (int8 layers gain nothing there: bitsandbytes quantises activations anyway)."""
    if precision != "auto":
        return precision == "bf16"
    if lm.device.type == "cuda":
        return True
    return lm.device.type == "cpu" and lm.quant in ("fp32", "bf16", "fp16") and cpu_has_amx()


def cpu_has_amx() -> bool:
    try:
        return bool(torch.cpu._is_amx_tile_supported())
    except (AttributeError, RuntimeError):
        return False


def activation_dtype(lm: FrozenLM, precision: str) -> torch.dtype:
    return torch.bfloat16 if uses_bf16(lm, precision) else lm.dtype


def autocast(lm: FrozenLM, precision: str):
    """bf16 autocast for activations where `uses_bf16`; the fp32 master embeddings are untouched."""
    if uses_bf16(lm, precision):
        return torch.autocast(device_type=lm.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
