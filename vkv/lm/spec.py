"""What caches and optimisers depend on in a model: its shapes and RoPE parameters, and a fingerprint of them."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ModelSpec:
    """Shapes and RoPE parameters that caches and optimisers depend on."""

    model_type: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    rope_theta: float
    rope_type: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prefill_bytes(
    spec: ModelSpec, intermediate: int, tokens: int, logit_rows: int, cache_itemsize: int, activation_itemsize: int
) -> int:
    """What feeding `tokens` tokens at once adds to memory (`vkv plan`'s arithmetic): their K/V, one layer's widest
    activations (the MLP's gate, up and product) and `logit_rows` rows of logits with a float32 copy and log-softmax."""
    kv = tokens * spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * cache_itemsize
    widest = 3 * tokens * intermediate * activation_itemsize
    logits = logit_rows * spec.vocab_size * (cache_itemsize + 4 + 4)
    return kv + widest + logits


def spec_from_config(config) -> ModelSpec:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return ModelSpec(
        model_type=config.model_type,
        num_layers=config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        hidden_size=config.hidden_size,
        vocab_size=config.vocab_size,
        rope_theta=float(theta),
        rope_type=str(rope.get("rope_type", "default")),
    )


def fingerprint(config, tokenizer) -> str:
    """Stable hash of what makes K/V comparable: architecture shapes, RoPE and the tokenizer's vocabulary."""
    spec = spec_from_config(config).to_dict()
    spec["rms_norm_eps"] = getattr(config, "rms_norm_eps", None)
    spec["rope_parameters"] = getattr(config, "rope_parameters", None)
    vocab = sorted(tokenizer.get_vocab().items())
    h = hashlib.sha256()
    h.update(json.dumps(spec, sort_keys=True, default=str).encode())
    h.update(json.dumps(vocab, ensure_ascii=False).encode())
    h.update((getattr(tokenizer, "chat_template", None) or "").encode())
    return h.hexdigest()[:16]
