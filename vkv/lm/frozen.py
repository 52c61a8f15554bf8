"""FrozenLM: a causal LM in eval mode with no trainable parameters, and what vkv's algorithms ask of it.

Everything that touches a Hugging Face model's internals (attention modules, rotary embedding, cache classes)
lives in this package, so the rest of vkv talks to one small surface.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from vkv.errors import TOO_LONG_REMEDY, VkvError
from vkv.kv.prefix import KVPrefix
from vkv.kv.ragged import RaggedCache
from vkv.kv.spliced import SplicedCache
from vkv.lm.kernel import (
    RecordingCache,
    StopForward,
    attend,
    attention_masks,
    rotate_half,
    with_entry_bias,
)
from vkv.lm.ragged_attention import use_ragged_attention
from vkv.lm.spec import fingerprint, prefill_bytes, spec_from_config

FAST_PATH_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")  # decoder layers forward_kv may run directly


def free_memory(device: torch.device) -> int | None:
    """Bytes free on `device`: CUDA's free memory, or the memory Linux says is available; None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class FirstLayer:
    norm_gain: torch.Tensor  # [hidden]
    norm_eps: float
    v_proj: torch.nn.Module
    k_proj: torch.nn.Module
    key_norm: bool  # a norm after k_proj (Qwen3): pre-RoPE keys are not affine in the input then


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
        self.spec = spec_from_config(model.config)
        self.fingerprint = fingerprint(model.config, tokenizer)
        # transformers 5.24 renamed the forward's `past_key_values` to `cache` (the old name warns, then goes)
        takes = inspect.signature(model.model.forward).parameters
        self.cache_arg = "cache" if "cache" in takes else "past_key_values"
        use_ragged_attention(model)  # reads RaggedCaches; on any other cache it runs as it was loaded

    # ---- what the algorithms need -------------------------------------------------------------
    def with_cache(self, cache) -> dict[str, Any]:
        """The keyword argument that hands `cache` to this transformers version's forward and generate."""
        return {self.cache_arg: cache}

    @property
    def config(self):
        return self.model.config

    @property
    def cache_shape(self) -> tuple[int, int, int]:
        """(layers, kv_heads, head_dim) of the K/V this model caches."""
        return self.spec.num_layers, self.spec.num_kv_heads, self.spec.head_dim

    @property
    def max_positions(self) -> int | None:
        """How many positions the model was trained on (None when its config does not say)."""
        return getattr(self.model.config, "max_position_embeddings", None)

    def check_positions(self, end: int, what: str, remedy: str | None = None) -> None:
        """Refuse, before any prefill, work that would place a token at position `end` − 1 or later beyond the
        model's positions; `remedy` ends the refusal (default: the running command's, `TOO_LONG_REMEDY`)."""
        if self.max_positions and end > self.max_positions:
            raise VkvError(
                f"{what}: reaches position {end}, beyond the {self.max_positions} positions of {self.name}; "
                f"{remedy or TOO_LONG_REMEDY.get()}"
            )

    def check_prefill(self, tokens: int, logit_rows: int, what: str) -> None:
        """Refuse, before it starts, a forward pass over `tokens` tokens (keeping `logit_rows` rows of logits) whose
        memory (`vkv plan`'s arithmetic) exceeds what the device has free; where that is unknown, nothing is checked."""
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        intermediate = getattr(self.model.config, "intermediate_size", 4 * self.spec.hidden_size)
        need = prefill_bytes(self.spec, intermediate, tokens, logit_rows, itemsize, itemsize)
        free = free_memory(self.device)
        if free is not None and need > free:
            raise VkvError(
                f"{what}: feeding {tokens} tokens at once needs about {need / 2**30:.1f} GiB, more than the "
                f"{free / 2**30:.1f} GiB free on {self.device}; {TOO_LONG_REMEDY.get()}, or use a smaller model"
            )

    def ragged_cache(self, spliced: SplicedCache, padded: bool = False) -> RaggedCache:
        """The decoding cache of `spliced` on this model's device and in its dtype."""
        return spliced.ragged(self.cache_shape, self.device, self.dtype, padded)

    def prefix(self, spliced: SplicedCache) -> KVPrefix:
        """`spliced` as the read-only prefix `forward_kv` optimises on, on this model's device and in its dtype."""
        return spliced.prefix(self.cache_shape, self.device, self.dtype)

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

    def first_layer(self) -> FirstLayer:
        """What layer 0 computes before any attention: its input norm's gain and epsilon, and its V and K
        projections (the least-squares init inverts them)."""
        layer = self.model.model.layers[0]
        norm, attn = layer.input_layernorm, layer.self_attn
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
        return FirstLayer(norm.weight.detach(), float(eps), attn.v_proj, attn.k_proj, hasattr(attn, "k_norm"))

    def decoder(self, ids: torch.Tensor, cache) -> None:
        """The decoder layers only (no LM head) over token ids `[1, n]`, filling `cache`."""
        self.model.model(input_ids=ids.to(self.device), **self.with_cache(cache), use_cache=True)

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
        return keys * cos + rotate_half(keys) * sin

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
        prefix: KVPrefix,
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
            k_rotated = k * cos + rotate_half(k) * sin
            keys.append(k_rotated if rope_keys else k)
            if i == last:
                break
            q = linear(attn.q_proj, x).view(batch, n, -1, head_dim)
            q = (attn.q_norm(q) if hasattr(attn, "q_norm") else q).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            prefix_keys = prefix_values = prefix_bias = None
            if not prefix.is_empty:  # flat entries are padded for this layer only
                prefix_keys, prefix_values, prefix_bias = prefix.layer(i)
                if not autocast:  # under autocast the matmul casts (a no-op for a bf16 prefix)
                    prefix_keys, prefix_values = prefix_keys.to(hidden.dtype), prefix_values.to(hidden.dtype)
            out = attend(q, k_rotated, v, prefix_keys, prefix_values, with_entry_bias(masks, prefix_bias), attn.scaling)
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

    def weight_copies(self) -> list[torch.Tensor]:
        """The low-precision weight copies `compute_weights` holds right now (to count their memory)."""
        return list((self._weight_copies or {}).values())

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
        recorder = RecordingCache(prefix, last, 0)
        new_mask = attention_masks(n, prefix, token_mask, self.dtype, self.device)[1]  # [B, 1, n, n]
        try:
            self.model.model(
                inputs_embeds=embeds.to(self.device, self.dtype),
                position_ids=positions.to(self.device).float().reshape(-1, n).expand(batch, n),
                attention_mask=new_mask.expand(batch, 1, n, n),
                **self.with_cache(recorder),
                use_cache=True,
            )
        except StopForward:
            pass
        return recorder.keys, recorder.values

    def new_cache(self):
        return DynamicCache(config=self.model.config)

    def stop_token_ids(self) -> set[int]:
        """End-of-sequence and end-of-turn ids: where greedy answers stop."""
        ids = set()
        eos = self.model.config.eos_token_id
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        # the end of a turn, or the start of the next one (a small model may skip the end marker)
        for marker in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>", "<|im_start|>"):
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
