"""Load a causal LM frozen, in the precision asked for, and expose what vkv's algorithms need.

Everything that touches a Hugging Face model's internals (attention modules, rotary embedding, cache
classes) lives here, so the rest of vkv talks to one small surface: `FrozenLM`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import VkvError

DEFAULT_MODEL = "Qwen/Qwen2.5-Coder-7B-Instruct"


class _DropBitsandbytesNoise(logging.Filter):
    """bitsandbytes logs on every int8 matmul that fp32 inputs are cast to fp16 (expected on CPU), and at
    import that an optional 4-bit CPU kernel package is absent; both flood the output without news."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not msg.startswith(("MatMul8bitLt: inputs will be cast", "Failed to load CPU gemm_4bit_forward"))


for _name in ("bitsandbytes.autograd._functions", "bitsandbytes.backends.cpu.ops"):
    logging.getLogger(_name).addFilter(_DropBitsandbytesNoise())
QUANTS = ("auto", "8bit", "4bit", "bf16", "fp16", "fp32")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # never flash_attention_2: it infers packing from position ids


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


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise VkvError(f"unknown device '{device}' (use cpu, cuda, cuda:N or auto)") from exc
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise VkvError(f"device '{device}' was requested but CUDA is not available on this machine")
    return resolved


def resolve_quant(quant: str, device: torch.device) -> str:
    if quant not in QUANTS:
        raise VkvError(f"unknown quantisation '{quant}'; choose one of {', '.join(QUANTS)}")
    if quant == "auto":
        return "8bit" if device.type == "cuda" else "fp32"
    return quant


def resolve_model_path(name: str) -> tuple[str, bool]:
    """Map an alias, a directory or a hub id to what from_pretrained takes; second item: is it local."""
    from . import zoo

    if name in zoo.ZOO:
        if not zoo.is_fetched(name):
            raise VkvError(f"model '{name}' is not fetched yet; run `vkv models fetch {name}` first")
        return str(zoo.model_path(name)), True
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise VkvError(f"model directory {path} has no config.json")
        return str(path), True
    if path.suffix or name.startswith((".", "/", "~")):
        raise VkvError(f"unknown model '{name}': not an alias ({', '.join(zoo.ZOO)}), a directory, or a hub id")
    return name, False


class FrozenLM:
    """A causal LM in eval mode with no trainable parameters, plus its tokenizer and a fingerprint."""

    def __init__(self, model, tokenizer, name: str, quant: str, device: torch.device, load_seconds: float = 0.0):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.quant = quant
        self.device = device
        self.load_seconds = load_seconds
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.spec = _spec_from_config(model.config)
        self.fingerprint = fingerprint(model.config, tokenizer)

    # ---- what the algorithms need -------------------------------------------------------------
    @property
    def config(self):
        return self.model.config

    @property
    def embedding_matrix(self) -> torch.Tensor:
        """Input embedding table `[vocab, hidden]`."""
        return self.model.get_input_embeddings().weight

    @property
    def dtype(self) -> torch.dtype:
        """The dtype activations flow in (the embedding dtype; int8 layers compute in it too)."""
        return self.embedding_matrix.dtype

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids `[..., n]` → input embeddings `[..., n, hidden]`."""
        return self.model.get_input_embeddings()(ids.to(self.device))

    def attention_modules(self) -> list[torch.nn.Module]:
        """One self-attention module per layer, in order (each has k_proj and v_proj)."""
        layers = self.model.model.layers
        return [layer.self_attn for layer in layers]

    def rope_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE tables at (possibly fractional) positions `[n]` → cos, sin `[n, head_dim]`."""
        pos = positions.to(self.device, torch.float32).reshape(1, -1)
        probe = torch.zeros(1, dtype=torch.float32, device=self.device)
        cos, sin = self.model.model.rotary_emb(probe, position_ids=pos)
        return cos[0], sin[0]

    def rotate(self, keys: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """Apply (or undo) RoPE to keys `[..., n, head_dim]` at positions `[n]`."""
        cos, sin = self.rope_cos_sin(positions)
        cos, sin = cos.to(keys.dtype), sin.to(keys.dtype)
        if inverse:
            sin = -sin
        half = keys.shape[-1] // 2
        rotated_half = torch.cat((-keys[..., half:], keys[..., :half]), dim=-1)
        return keys * cos + rotated_half * sin

    def causal_mask(self, past_length: int, new_length: int) -> torch.Tensor:
        """Additive mask `[1, 1, new, past + new]`: every new token sees all past entries and earlier new ones.

        Always passed explicitly, because with non-unit position steps transformers may otherwise infer
        packed sequences and block attention across them.
        """
        blocked = torch.ones(new_length, new_length, dtype=torch.bool, device=self.device).triu(1)
        mask = torch.zeros(new_length, past_length + new_length, dtype=self.dtype, device=self.device)
        mask[:, past_length:].masked_fill_(blocked, torch.finfo(self.dtype).min)
        return mask[None, None]

    def forward_kv(
        self,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        prefix: "KVPrefix",
        last_layer: int | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Run input embeddings `[1, n, hidden]` at `positions` `[n]` on top of a read-only prefix.

        Returns the new tokens' post-RoPE keys and values per layer (each `[1, kv_heads, n, head_dim]`) up
        to `last_layer` (default: all); the pass stops right after that layer's K/V projection, so later
        layers, the attention output, MLP, final norm and LM head are never computed.
        """
        last = self.spec.num_layers - 1 if last_layer is None else last_layer
        recorder = _RecordingPrefix(prefix, last)
        mask = self.causal_mask(prefix.length, embeds.shape[1])
        try:
            self.model.model(
                inputs_embeds=embeds.to(self.dtype),
                position_ids=positions.to(self.device).float().reshape(1, -1),
                attention_mask=mask,
                past_key_values=recorder,
                use_cache=True,
            )
        except _StopForward:
            pass
        return recorder.keys, recorder.values

    def attention_to(self, ids: torch.Tensor, keys_start: int, keys_end: int, queries_start: int) -> torch.Tensor:
        """Mean attention `[keys_end - keys_start]` that tokens ids[queries_start:] pay to ids[keys_start:keys_end],
        averaged over layers, heads and query tokens (eager attention, the only kind that returns weights)."""
        current = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")
        try:
            with torch.no_grad():
                out = self.model(input_ids=ids.reshape(1, -1).to(self.device), output_attentions=True)
        finally:
            self.model.set_attn_implementation(current)
        per_layer = [a[0, :, queries_start:, keys_start:keys_end].float().mean(dim=(0, 1)) for a in out.attentions]
        return torch.stack(per_layer).mean(0).cpu()

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @staticmethod
    def crop_cache(cache, length: int) -> None:
        """Drop every entry past `length` (transformers' own crop changed meaning across versions)."""
        for layer in cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.shape[2] > length:
                layer.keys = layer.keys[:, :, :length]
                layer.values = layer.values[:, :, :length]

    def stop_token_ids(self) -> set[int]:
        """End-of-sequence and end-of-turn ids: where greedy answers stop."""
        ids = set()
        eos = self.model.config.eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        for marker in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>"):
            tid = self.tokenizer.convert_tokens_to_ids(marker)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id:
                ids.add(tid)
        return ids

    def describe(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "quant": self.quant,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "fingerprint": self.fingerprint,
            **self.spec.to_dict(),
        }


def load_model(
    name: str = DEFAULT_MODEL,
    quant: str = "auto",
    device: str | None = None,
    attn_implementation: str = "sdpa",
) -> FrozenLM:
    """Load `name` (hub id, directory or alias) frozen, quantised as asked, on `device`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise VkvError(f"attention implementation '{attn_implementation}' is not supported; use sdpa or eager")
    dev = resolve_device(device)
    q = resolve_quant(quant, dev)
    path, local = resolve_model_path(name)
    start = time.perf_counter()
    kwargs: dict[str, Any] = dict(attn_implementation=attn_implementation, local_files_only=local)
    kwargs.update(_quant_kwargs(q, dev))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # callers show their own status; per-tensor bars drown it
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        where = "directory" if local else "hub id (not available offline or in the Hugging Face cache)"
        raise VkvError(f"could not load model '{name}' as a {where}: {str(exc).splitlines()[0]}") from exc
    if q not in ("8bit", "4bit"):
        model.to(dev)
    return FrozenLM(model, tokenizer, name=name, quant=q, device=dev, load_seconds=time.perf_counter() - start)


def _quant_kwargs(quant: str, device: torch.device) -> dict[str, Any]:
    if quant in ("8bit", "4bit"):
        from transformers import BitsAndBytesConfig

        compute = torch.float32 if device.type == "cpu" else torch.bfloat16
        if quant == "8bit":
            bnb = BitsAndBytesConfig(load_in_8bit=True)
        else:
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)
        dtype = torch.float32 if device.type == "cpu" else torch.float16
        return dict(quantization_config=bnb, dtype=dtype, device_map={"": str(device)})
    return dict(dtype={"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[quant])


def _spec_from_config(config) -> ModelSpec:
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
    spec = _spec_from_config(config).to_dict()
    spec["rms_norm_eps"] = getattr(config, "rms_norm_eps", None)
    spec["rope_parameters"] = getattr(config, "rope_parameters", None)
    vocab = sorted(tokenizer.get_vocab().items())
    h = hashlib.sha256()
    h.update(json.dumps(spec, sort_keys=True, default=str).encode())
    h.update(json.dumps(vocab, ensure_ascii=False).encode())
    h.update((getattr(tokenizer, "chat_template", None) or "").encode())
    return h.hexdigest()[:16]


@dataclass
class KVPrefix:
    """Read-only per-layer keys and values `[1, kv_heads, length, head_dim]` that new tokens attend to."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    @classmethod
    def from_cache(cls, cache, length: int | None = None) -> "KVPrefix":
        """Views of the first `length` entries of a transformers cache (no copy)."""
        keys = [layer.keys[:, :, :length] for layer in cache.layers]
        values = [layer.values[:, :, :length] for layer in cache.layers]
        return cls(keys, values)


class _StopForward(Exception):
    """Raised inside the last needed layer so nothing after its K/V projection is computed."""


class _RecordingPrefix:
    """Duck-typed cache: records the new tokens' K/V and returns prefix ⊕ new, never mutating the prefix."""

    def __init__(self, prefix: KVPrefix, last_layer: int):
        self.prefix = prefix
        self.last_layer = last_layer
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys.append(key_states)
        self.values.append(value_states)
        if layer_idx == self.last_layer:
            raise _StopForward
        if self.prefix.length == 0:
            return key_states, value_states
        keys = torch.cat([self.prefix.keys[layer_idx].to(key_states.dtype), key_states], dim=2)
        values = torch.cat([self.prefix.values[layer_idx].to(value_states.dtype), value_states], dim=2)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.prefix.length
