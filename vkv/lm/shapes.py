"""Architectures vkv knows without the hub: their configs, and models of their shape with random weights.

A random-weight model measures time and memory in a setting no weights are needed for (a 7B model's, on any GPU,
with no download); what it computes means nothing, so no quality is ever read from one. `layers` builds only the
first layers of a shape, so that a large one fits a small machine: per-layer work then shrinks in proportion, the
embedding and LM head stay whole.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from vkv.errors import VkvError
from vkv.lm.frozen import FrozenLM
from vkv.lm.load import resolve_device, resolve_quant


@dataclass(frozen=True)
class Shape:
    """A shipped architecture: the fields of its public config.json that fix its shapes and RoPE."""

    hub_id: str | None  # the model whose config this is (None: a shape of vkv's own, for its tests)
    settings: dict[str, Any]  # transformers config fields, `model_type` among them

    def config(self, layers: int | None = None) -> PretrainedConfig:
        """The transformers config, with only its first `layers` decoder layers when given."""
        settings = dict(self.settings)
        if layers is not None:
            if layers > settings["num_hidden_layers"]:
                raise VkvError(
                    f"field layers: {layers} is more than the {settings['num_hidden_layers']} layers of this shape"
                )
            settings["num_hidden_layers"] = layers
        return AutoConfig.for_model(settings.pop("model_type"), **settings)


SHAPES = {
    "qwen2.5-coder-7b": Shape(
        "Qwen/Qwen2.5-Coder-7B-Instruct",
        dict(
            model_type="qwen2",
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            head_dim=128,
            vocab_size=152064,
            tie_word_embeddings=False,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
        ),
    ),
    "qwen2.5-coder-1.5b": Shape(
        "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        dict(
            model_type="qwen2",
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            head_dim=128,
            vocab_size=151936,
            tie_word_embeddings=True,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
        ),
    ),
    "llama-3.1-8b": Shape(
        "meta-llama/Llama-3.1-8B-Instruct",
        dict(
            model_type="llama",
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=128256,
            tie_word_embeddings=False,
            max_position_embeddings=131072,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8192,
            ),
            rms_norm_eps=1e-5,
        ),
    ),
    # a qwen2 small enough to build in a second, whose vocabulary holds the test model's tokenizer: for checking the
    # machinery that builds and measures the others
    "tiny-qwen2": Shape(
        None,
        dict(
            model_type="qwen2",
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=49152,
            tie_word_embeddings=True,
            max_position_embeddings=8192,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
        ),
    ),
}
SHAPE_QUANTS = ("auto", "8bit", "bf16", "fp16", "fp32")  # 4-bit would need bitsandbytes' NF4 packing: not built here


def shape_config(name: str, layers: int | None = None) -> PretrainedConfig:
    if name not in SHAPES:
        raise VkvError(f"field shape: unknown shape '{name}'; choose from {', '.join(SHAPES)}")
    return SHAPES[name].config(layers)


def build_random(
    name: str, tokenizer, quant: str = "bf16", device: str | None = "cpu", layers: int | None = None, seed: int = 0
) -> FrozenLM:
    """A model of shape `name` with random weights (seeded), frozen, on `device`, its weights in `quant`: bf16, fp16
    and fp32 as built; 8bit as `load_model` loads one (bitsandbytes int8 linear layers inside the decoder layers,
    everything else in fp16 on CUDA and fp32 on the CPU). `tokenizer` only writes token ids, so its vocabulary must
    fit the shape's."""
    dev = resolve_device(device)
    q = resolve_quant(quant, dev)
    if q not in SHAPE_QUANTS:
        raise VkvError(
            f"field quant: '{q}' is not built for random-weight shapes; choose from {', '.join(SHAPE_QUANTS)}"
        )
    config = shape_config(name, layers)
    if len(tokenizer) > config.vocab_size:
        raise VkvError(
            f"field model: its tokenizer's {len(tokenizer)} tokens do not fit the {config.vocab_size}-token vocabulary "
            f"of shape {name}; pass a model whose tokenizer is smaller"
        )
    config._attn_implementation = "sdpa"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(q)
    if q == "8bit":
        dtype = torch.float16 if dev.type == "cuda" else torch.float32
    start = time.perf_counter()
    torch.manual_seed(seed)
    with torch.device(dev):  # built where it runs: a 7B shape never passes through host memory on its way to a GPU
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if q == "8bit":
        _quantise_int8(model, dev)
    return FrozenLM(model, tokenizer, name=name, quant=q, device=dev, load_seconds=time.perf_counter() - start)


def _quantise_int8(model: torch.nn.Module, device: torch.device) -> None:
    """Replace every linear layer of the decoder layers by bitsandbytes' int8 layer, as `load_in_8bit` does (the LM
    head stays as it is, as transformers leaves it); bitsandbytes quantises a weight when it is moved to the device."""
    import bitsandbytes as bnb  # only 8-bit shapes need it

    for layer in model.model.layers:
        for parent in list(layer.modules()):
            for child_name, child in list(parent.named_children()):
                if type(child) is not torch.nn.Linear:
                    continue
                int8 = bnb.nn.Linear8bitLt(
                    child.in_features, child.out_features, bias=child.bias is not None, has_fp16_weights=False
                )
                int8.weight = bnb.nn.Int8Params(child.weight.data.cpu(), requires_grad=False, has_fp16_weights=False)
                if child.bias is not None:
                    int8.bias = torch.nn.Parameter(child.bias.data, requires_grad=False)
                setattr(parent, child_name, int8.to(device))
