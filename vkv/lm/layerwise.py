"""Token sequences run through the decoder one layer at a time, each layer over context entries given only when the
pass reaches it: what on-policy attention matching needs (compress/on_policy.py). Layer l's queries of the tokens
come from layers < l run over the entries those layers were given (compacted ones, say), and layer l's entries can
be chosen after seeing them; one pass over the layers, not one forward per layer.

Each sequence attends to its own context entries (the same for all) and causally to itself, as `FrozenLM.forward_kv`'s
direct path runs a pre-norm decoder layer; the architectures are that path's.
"""

from __future__ import annotations

import torch

from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.lm.frozen import FrozenLM
from vkv.lm.kernel import attend, attention_masks, rotate_half, with_entry_bias


class LayerwisePass:
    """Sequences of token ids, each at its own positions, advanced through the decoder layer by layer."""

    def __init__(self, lm: FrozenLM, sequences: list[list[int]], positions: list[torch.Tensor]):
        """`positions[i]` `[len(sequences[i])]`: the logical positions of sequence i's tokens."""
        if not lm.fast_path_supported:
            raise VkvError(
                f"running {lm.name} one layer at a time (on-policy attention matching) is not implemented for "
                f"model type '{lm.config.model_type}'; vkv runs llama, qwen2, qwen3 and mistral layers (full attention)"
            )
        self.lm = lm
        self.layer = 0  # the next layer to run
        with torch.no_grad():
            self.hidden = [lm.embed(torch.tensor(ids))[None].to(lm.dtype) for ids in sequences]  # [1, len, hidden]
        self.rope = [lm.rope_cos_sin(p.float()) for p in positions]  # cos, sin [len, head_dim] each
        self._projected: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None

    def queries(self) -> list[torch.Tensor]:
        """The current layer's queries of every sequence, post-RoPE and unscaled: `[heads, len, head_dim]` each."""
        return [q[0] for q, _, _ in self._project()]

    def advance(self, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Run the current layer, every sequence attending to the context entries `keys`, `values`
        `[1, kv_heads, L, head_dim]` (post-RoPE, as cached) with `bias` `[1, kv_heads, L]` (None: 0) added to their
        logits, then causally to itself; move on to the next layer."""
        decoder_layer = self.lm.model.model.layers[self.layer]
        attn = decoder_layer.self_attn
        with torch.no_grad():
            for i, (q, k, v) in enumerate(self._project()):
                masks = with_entry_bias(
                    attention_masks(q.shape[2], KVPrefix.empty(), None, torch.float32, q.device), bias
                )
                out = attend(q, k, v, keys.to(q.dtype), values.to(q.dtype), masks, attn.scaling)
                hidden = self.hidden[i] + attn.o_proj(out)
                self.hidden[i] = hidden + decoder_layer.mlp(decoder_layer.post_attention_layernorm(hidden))
        self._projected = None
        self.layer += 1

    def _project(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Every sequence's queries and keys (post-RoPE) and values at the current layer, `[1, heads or kv_heads,
        len, head_dim]` each; computed once per layer."""
        if self._projected is None:
            if self.layer >= self.lm.spec.num_layers:
                raise ValueError(f"the pass has run all {self.lm.spec.num_layers} layers")
            decoder_layer = self.lm.model.model.layers[self.layer]
            attn, dim = decoder_layer.self_attn, self.lm.spec.head_dim
            self._projected = []
            with torch.no_grad():
                for hidden, (cos, sin) in zip(self.hidden, self.rope):
                    x = decoder_layer.input_layernorm(hidden)
                    n = x.shape[1]
                    q = attn.q_proj(x).view(1, n, -1, dim)
                    k = attn.k_proj(x).view(1, n, -1, dim)
                    q = (attn.q_norm(q) if hasattr(attn, "q_norm") else q).transpose(1, 2)
                    k = (attn.k_norm(k) if hasattr(attn, "k_norm") else k).transpose(1, 2)
                    v = attn.v_proj(x).view(1, n, -1, dim).transpose(1, 2)
                    cos_, sin_ = cos.to(q.dtype), sin.to(q.dtype)
                    self._projected.append((q * cos_ + rotate_half(q) * sin_, k * cos_ + rotate_half(k) * sin_, v))
        return self._projected
