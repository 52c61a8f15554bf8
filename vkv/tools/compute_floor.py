"""The compute floor of one optimisation step: the matmul FLOPs it needs, and matmuls at the step's shapes and at
the machine's best case, whose timing gives this machine's throughput."""

from __future__ import annotations

import torch

from vkv.lm.frozen import FrozenLM


def step_flops(lm: FrozenLM, n: int, width: int, last_layer: int | None = None) -> dict[str, int]:
    """Matmul FLOPs of one optimisation step for n virtual tokens attending to `width` keys (prefix + n).

    Forward: every layer before the deepest needed one in full, that one only to its V projection. Backward
    with frozen weights needs input gradients only: one matmul per linear layer, and for attention the
    queries' and the attention weights' gradients (plus the new keys' and values', n wide)."""
    s = lm.spec
    config = lm.model.config
    last = s.num_layers - 1 if last_layer is None else last_layer
    q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    linear = s.hidden_size * (2 * q_out + 2 * kv_out) + 3 * s.hidden_size * config.intermediate_size
    attention = 4 * s.num_heads * s.head_dim * width  # QKᵀ and PV, per token
    forward = last * 2 * n * linear + last * n * attention + 2 * n * s.hidden_size * kv_out
    backward = last * 2 * n * linear + last * n * (attention + 4 * s.num_heads * s.head_dim * n)
    backward += 2 * n * s.hidden_size * kv_out
    return {"forward": forward, "backward": backward, "total": forward + backward}


def layer_matmuls(lm: FrozenLM, n: int, width: int, dtype: torch.dtype = torch.float32):
    """(a function running every layer's forward matmuls of a step at their shapes — the linear layers with
    n rows, the attention products over `width` keys — and their FLOPs)."""
    s, dev = lm.spec, lm.device
    intermediate = lm.model.config.intermediate_size
    q_out, kv_out = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    groups = s.num_heads // s.num_kv_heads

    def rand(*shape):
        return torch.randn(*shape, device=dev, dtype=dtype)

    x, up, attention_out = rand(n, s.hidden_size), rand(n, intermediate), rand(n, q_out)
    weights = [rand(o, s.hidden_size) for o in (q_out, kv_out, kv_out, intermediate, intermediate)]
    out_proj, mlp_out = rand(s.hidden_size, q_out), rand(s.hidden_size, intermediate)
    q, keys = rand(s.num_kv_heads, groups * n, s.head_dim), rand(s.num_kv_heads, width, s.head_dim)
    probs = rand(s.num_kv_heads, groups * n, width)
    linear = torch.nn.functional.linear

    def all_layers():  # as long as a forward pass, so that timing it is as noisy as timing a step
        for _ in range(s.num_layers):
            for w in weights:
                linear(x, w)
            linear(attention_out, out_proj)
            linear(up, mlp_out)
            q @ keys.transpose(-1, -2)
            probs @ keys
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    flops = 2 * n * (s.hidden_size * (2 * q_out + 2 * kv_out) + 3 * s.hidden_size * intermediate)
    return all_layers, s.num_layers * (flops + 4 * s.num_heads * s.head_dim * width * n)


def peak_matmul(lm: FrozenLM, dtype: torch.dtype = torch.float32, size: int = 2048, repeats: int = 4):
    """(a function running large square matmuls, their FLOPs): the machine's best case."""
    a = torch.randn(size, size, device=lm.device, dtype=dtype)
    b = torch.randn(size, size, device=lm.device, dtype=dtype)

    def run():
        for _ in range(repeats):
            a @ b

    return run, repeats * 2 * size**3
