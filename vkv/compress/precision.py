"""The precision of the activations an optimisation runs in: bf16 where its matmuls are fast, else the model's."""

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
