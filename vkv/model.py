"""Load a causal LM frozen, in the precision asked for, and expose what vkv's algorithms need.

Everything that touches a Hugging Face model's internals (attention modules, rotary embedding, cache
classes) lives here, so the rest of vkv talks to one small surface: `FrozenLM`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from contextlib import contextmanager
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
FAST_PATH_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")  # decoder layers forward_kv may run directly


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
        self._weight_copies: dict | None = None
        self._weight_copies_dtype: torch.dtype | None = None
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
        """RoPE tables at (possibly fractional) positions `[n]` (or `[B, n]`) → cos, sin `[n, head_dim]`
        (or `[B, n, head_dim]`)."""
        pos = positions.to(self.device, torch.float32)
        probe = torch.zeros(1, dtype=torch.float32, device=self.device)
        cos, sin = self.model.model.rotary_emb(probe, position_ids=pos.reshape(-1, pos.shape[-1]))
        return (cos[0], sin[0]) if pos.dim() == 1 else (cos, sin)

    def rotate(self, keys: torch.Tensor, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """Apply (or undo) RoPE to keys `[..., n, head_dim]` at positions `[n]` (or `[B, n]` for keys
        `[B, heads, n, head_dim]`)."""
        cos, sin = self.rope_cos_sin(positions)
        cos, sin = cos.to(keys.dtype), sin.to(keys.dtype)
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]
        if inverse:
            sin = -sin
        return keys * cos + _rotate_half(keys) * sin

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
        token_mask: torch.Tensor | None = None,
        last_keys: bool = True,
        rope_keys: bool = True,
        fast: bool | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Run input embeddings `[B, n, hidden]` at `positions` (`[n]` or `[B, n]`) on top of a read-only prefix.

        Returns the new tokens' keys (post-RoPE unless `rope_keys=False`) and values per layer (each
        `[B, kv_heads, n, head_dim]`) up to `last_layer` (default: all); the pass stops right after that
        layer's K/V projection, so its attention, its MLP, later layers, the final norm and the LM head are
        never computed (nor its K projection when `last_keys=False`; that layer's key is then None).
        `token_mask` `[B, n]` marks real tokens in a padded batch: padding is never attended to. The prefix's
        batch is 1 or B; `prefix.valid` masks its padding.

        `fast` (default: when the architecture allows) runs the decoder layers directly and attends to the
        prefix without copying or repeating it; otherwise the model's own forward runs with a recording cache.
        """
        last = self.spec.num_layers - 1 if last_layer is None else last_layer
        if fast is None:
            fast = self.fast_path_supported
        if fast:
            return self._forward_kv_direct(embeds, positions, prefix, last, token_mask, last_keys, rope_keys)
        keys, values = self._forward_kv_recording(embeds, positions, prefix, last, token_mask)
        if not rope_keys:
            pos = positions.to(self.device, torch.float32).reshape(-1, embeds.shape[1])
            keys = [self.rotate(k, pos, inverse=True) for k in keys]
        if not last_keys:
            keys[last] = None
        return keys, values

    @property
    def fast_path_supported(self) -> bool:
        """Pre-norm decoder layers (norm → attention → residual → norm → MLP → residual), full attention."""
        config = self.model.config
        if config.model_type not in FAST_PATH_MODEL_TYPES:
            return False
        if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
            return False
        window = getattr(config, "sliding_window", None)
        return window is None or config.model_type != "mistral"

    def _forward_kv_direct(self, embeds, positions, prefix, last, token_mask, last_keys, rope_keys):
        batch, n, _ = embeds.shape
        decoder = self.model.model
        head_dim = self.spec.head_dim
        pos = positions.to(self.device, torch.float32).reshape(-1, n).expand(batch, n)
        hidden = embeds.to(self.device, self.dtype)
        cos, sin = decoder.rotary_emb(hidden, position_ids=pos)
        cos, sin = cos[:, None], sin[:, None]  # [B, 1, n, head_dim]: broadcast over heads
        masks = attention_masks(n, prefix, token_mask, torch.float32, self.device)
        autocast = torch.is_autocast_enabled(self.device.type)
        compute_dtype = torch.get_autocast_dtype(self.device.type) if autocast else None
        linear = self._linear_in(compute_dtype)

        def compute(x: torch.Tensor) -> torch.Tensor:  # one cast per input shared by linear layers
            return x if compute_dtype is None else x.to(compute_dtype)

        keys: list[torch.Tensor | None] = []
        values: list[torch.Tensor] = []
        for i, layer in enumerate(decoder.layers[: last + 1]):
            attn = layer.self_attn
            x = compute(layer.input_layernorm(hidden))
            v = linear(attn.v_proj, x).view(batch, n, -1, head_dim).transpose(1, 2)
            values.append(v)
            if i == last and not last_keys:
                keys.append(None)
                break
            k = linear(attn.k_proj, x).view(batch, n, -1, head_dim)
            k = (attn.k_norm(k) if hasattr(attn, "k_norm") else k).transpose(1, 2)
            k_rotated = k * cos + _rotate_half(k) * sin
            keys.append(k_rotated if rope_keys else k)
            if i == last:
                break
            q = linear(attn.q_proj, x).view(batch, n, -1, head_dim)
            q = (attn.q_norm(q) if hasattr(attn, "q_norm") else q).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            prefix_keys, prefix_values = (prefix.keys[i], prefix.values[i]) if prefix.length else (None, None)
            if prefix.length and not autocast:  # under autocast the matmul casts (a no-op for a bf16 prefix)
                prefix_keys, prefix_values = prefix_keys.to(hidden.dtype), prefix_values.to(hidden.dtype)
            out = attend(q, k_rotated, v, prefix_keys, prefix_values, masks, attn.scaling)
            hidden = hidden + linear(attn.o_proj, compute(out))
            x = compute(layer.post_attention_layernorm(hidden))
            mlp = layer.mlp
            if hasattr(mlp, "gate_proj"):  # gated MLP (all FAST_PATH_MODEL_TYPES)
                hidden = hidden + linear(mlp.down_proj, mlp.act_fn(linear(mlp.gate_proj, x)) * linear(mlp.up_proj, x))
            else:
                hidden = hidden + mlp(x)
        return keys, values

    @contextmanager
    def compute_weights(self, dtype: torch.dtype | None):
        """Within the block, the direct forward multiplies by `dtype` copies of the fp32 linear weights,
        made once (autocast would otherwise re-cast every frozen weight at every call; 16-bit weights are
        left to autocast rather than doubled), and feeds int8 layers `dtype` inputs so bitsandbytes
        dequantises straight to it. No-op for None."""
        previous = self._weight_copies, self._weight_copies_dtype
        if dtype is not None and self._weight_copies_dtype != dtype:  # nested blocks share the copies
            self._weight_copies_dtype = dtype
            self._weight_copies = {
                module: module.weight.detach().to(dtype)
                for module in self.model.model.layers.modules()
                if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32  # half their size
            }
        try:
            yield
        finally:
            self._weight_copies, self._weight_copies_dtype = previous

    def _linear_in(self, dtype: torch.dtype | None):
        copies = (self._weight_copies or {}) if dtype is not None and dtype == self._weight_copies_dtype else {}

        def linear(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
            weight = copies.get(module)
            if weight is not None:
                bias = None if module.bias is None else module.bias.to(weight.dtype)
                return torch.nn.functional.linear(x.to(weight.dtype), weight, bias)
            if dtype is not None and type(module) is not torch.nn.Linear:  # int8/4-bit layers
                return module(x.to(dtype))
            return module(x)

        return linear

    def _forward_kv_recording(self, embeds, positions, prefix, last, token_mask):
        batch, n, _ = embeds.shape
        recorder = _RecordingPrefix(prefix, last, batch)
        bias = attention_bias(n, prefix, token_mask, self.dtype, self.device)  # [B, 1, n, L + n]
        try:
            self.model.model(
                inputs_embeds=embeds.to(self.device, self.dtype),
                position_ids=positions.to(self.device).float().reshape(-1, n).expand(batch, n),
                attention_mask=bias.expand(batch, 1, n, prefix.length + n),
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
    """Read-only per-layer keys and values `[B, kv_heads, length, head_dim]` that new tokens attend to.

    `valid` `[B, length]` (bool) marks real entries when prefixes of different lengths are padded into a
    batch; None means all entries are real."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    valid: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    @classmethod
    def from_cache(cls, cache, length: int | None = None) -> "KVPrefix":
        """Views of the first `length` entries of a transformers cache (no copy)."""
        keys = [layer.keys[:, :, :length] for layer in cache.layers]
        values = [layer.values[:, :, :length] for layer in cache.layers]
        return cls(keys, values)

    def to(self, device: torch.device, dtype: torch.dtype) -> "KVPrefix":
        """The same prefix on `device` in `dtype` (no copy when it already is)."""
        valid = None if self.valid is None else self.valid.to(device)
        return KVPrefix([k.to(device, dtype) for k in self.keys], [v.to(device, dtype) for v in self.values], valid)

    def to_dynamic_cache(self, lm: "FrozenLM"):
        """A transformers DynamicCache holding these entries on the model's device and dtype (autograd-tracked
        when the entries are)."""
        cache = lm.new_cache()
        for layer, (k, v) in enumerate(zip(self.keys, self.values)):
            cache.update(k.to(lm.device, lm.dtype), v.to(lm.device, lm.dtype), layer)
        return cache

    @classmethod
    def stack(cls, prefixes: list["KVPrefix"]) -> "KVPrefix":
        """One batch of prefixes, right-padded to the longest (a single copy, made once)."""
        longest = max(p.length for p in prefixes)
        if longest == 0:
            return cls([], [])
        layers = len(next(p for p in prefixes if p.length).keys)
        sample = next(p for p in prefixes if p.length).keys[0]
        heads, dim = sample.shape[1], sample.shape[3]
        shape = (len(prefixes), heads, longest, dim)
        keys = [sample.new_zeros(shape) for _ in range(layers)]
        values = [sample.new_zeros(shape) for _ in range(layers)]
        valid = torch.zeros(len(prefixes), longest, dtype=torch.bool, device=sample.device)
        for b, p in enumerate(prefixes):
            for layer in range(p.length and layers):
                keys[layer][b, :, : p.length] = p.keys[layer][0]
                values[layer][b, :, : p.length] = p.values[layer][0]
            valid[b, : p.length] = True if p.valid is None else p.valid[0]
        return cls(keys, values, None if bool(valid.all()) else valid)


def attention_masks(
    new_length: int, prefix: KVPrefix, token_mask: torch.Tensor | None, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Additive masks for new tokens attending to the prefix (`[B, 1, 1, L]`, None when nothing is padded)
    and to each other (`[B, 1, n, n]`, B = 1 without a token mask): every real prefix entry is visible, and
    the real new tokens up to and including oneself."""
    blocked_new = torch.ones(new_length, new_length, dtype=torch.bool, device=device).triu(1)[None]
    if token_mask is not None:
        blocked_new = blocked_new | ~token_mask.to(device, torch.bool)[:, None, :]
    new_bias = torch.zeros(blocked_new.shape, dtype=dtype, device=device).masked_fill_(blocked_new, torch.finfo(dtype).min)
    prefix_bias = None
    if prefix.valid is not None:
        blocked = ~prefix.valid.to(device)[:, None, None, :]
        prefix_bias = torch.zeros(blocked.shape, dtype=dtype, device=device).masked_fill_(blocked, torch.finfo(dtype).min)
    return prefix_bias, new_bias[:, None]


def attention_bias(
    new_length: int, prefix: KVPrefix, token_mask: torch.Tensor | None, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """The two masks of `attention_masks` joined: `[B, 1, n, L + n]` over prefix ⊕ new keys."""
    prefix_bias, new_bias = attention_masks(new_length, prefix, token_mask, dtype, device)
    if prefix_bias is None:
        prefix_bias = torch.zeros(1, 1, 1, prefix.length, dtype=dtype, device=device)
    batch = max(prefix_bias.shape[0], new_bias.shape[0])
    prefix_bias = prefix_bias.expand(batch, 1, new_length, prefix.length)
    return torch.cat([prefix_bias, new_bias.expand(batch, 1, new_length, new_length)], dim=-1)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_keys: torch.Tensor | None,
    prefix_values: torch.Tensor | None,
    masks: tuple[torch.Tensor | None, torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """Softmax attention of queries `[B, heads, n, D]` over a read-only prefix `[B, kv_heads, L, D]` and the
    new keys/values `[B, kv_heads, n, D]`, with the additive masks of `attention_masks`; → `[B, n, heads * D]`.

    Nothing the size of the prefix is copied: query heads are grouped under the KV head they share instead
    of repeating K/V, and the softmax over prefix ⊕ new is computed in two parts sharing one shift and one
    normaliser instead of concatenating keys or scores. The prefix needs no gradient, so backward computes
    only the queries' share of its matmuls."""
    batch, heads, n, dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    prefix_bias, new_bias = masks
    new_bias = new_bias[:, :, None].expand(-1, -1, groups, -1, -1).reshape(-1, 1, groups * n, n)
    q = (q * scale).reshape(batch, kv_heads, groups * n, dim)

    def scores(keys: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        s = q @ keys.transpose(-1, -2)
        return s if bias is None else s + bias

    new_scores = scores(k, new_bias)
    if prefix_keys is None:
        out = new_scores.softmax(dim=-1, dtype=torch.float32).to(v.dtype) @ v
    else:  # the prefix part stays in the matmul's dtype (bf16 under autocast): exp of scores ≤ 0 is in [0, 1]
        prefix_scores = scores(prefix_keys, prefix_bias)
        shift = torch.maximum(prefix_scores.amax(-1, keepdim=True), new_scores.amax(-1, keepdim=True)).detach()
        prefix_weights = prefix_scores.sub_(shift.to(prefix_scores.dtype)).exp_()
        new_weights = new_scores.sub_(shift.to(new_scores.dtype)).exp_()
        total = prefix_weights.sum(-1, keepdim=True).float() + new_weights.sum(-1, keepdim=True).float()
        out = (prefix_weights @ prefix_values + new_weights.to(v.dtype) @ v) / total
    return out.view(batch, kv_heads, groups, n, dim).permute(0, 3, 1, 2, 4).reshape(batch, n, heads * dim)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _StopForward(Exception):
    """Raised inside the last needed layer so nothing after its K/V projection is computed."""


class _RecordingPrefix:
    """Duck-typed cache: records the new tokens' K/V and returns prefix ⊕ new, never mutating the prefix.

    The model's own attention needs one tensor, so this path copies the prefix every layer and step; the
    direct path in `FrozenLM.forward_kv` avoids that and is used whenever the architecture allows."""

    def __init__(self, prefix: KVPrefix, last_layer: int, batch: int = 1):
        self.prefix = prefix
        self.last_layer = last_layer
        self.batch = batch
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys.append(key_states)
        self.values.append(value_states)
        if layer_idx == self.last_layer:
            raise _StopForward
        if self.prefix.length == 0:
            return key_states, value_states
        shape = (self.batch, -1, -1, -1)
        keys = torch.cat([self.prefix.keys[layer_idx].to(key_states.dtype).expand(shape), key_states], dim=2)
        values = torch.cat([self.prefix.values[layer_idx].to(value_states.dtype).expand(shape), value_states], dim=2)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.prefix.length
