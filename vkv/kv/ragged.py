"""RaggedCache: a transformers `Cache` whose compressed entries take the memory they use, and no more.

Head-wise budgets (kvzip, am, vkv's head shares) keep a different number of entries in each KV head. Per layer this
cache holds those entries flattened, one head after the other (`FlatHeads`: keys and values `[Σ_h n_h, head_dim]`,
biases `[Σ_h n_h]`, the heads' offsets `[kv_heads + 1]`), and everything else in a dense part `[batch, kv_heads,
length, head_dim]`: verbatim segments, segments without padding (with their biases `[1, kv_heads, loaded]` when
any carries one), and every token fed afterwards (questions, generated tokens, new messages).

The cache also owns the logical position. A compressed span holds fewer entries than the positions it covers, so
`get_seq_length()` is the position the next token takes on the RoPE axis, and transformers places new tokens there by
itself; `generate_inputs(prompt)` builds what `generate()` expects for that length.

Attention over this layout is `vkv.lm.ragged_attention`, registered with transformers' AttentionInterface: `update()`
returns the dense keys tagged with their layer (attribute `RAGGED_TAG`), which is how that function finds the flat
entries and the biases. Padding to the longest head exists only inside it, as one layer's temporary. Those keys are
`RaggedKeys`: any other attention that computes on them raises a VkvError naming the fix (and the update is undone),
since reading them alone would answer as if the compressed entries were not there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from vkv.errors import VkvError
from vkv.kv.flat import FlatHeads
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment

RAGGED_TAG = "vkv_ragged_layer"  # the attribute of the keys `update()` returns that names their RaggedLayer


class RaggedKeys(torch.Tensor):
    """The keys a RaggedLayer's `update()` returns, `[batch, kv_heads, fed, head_dim]`: only the tokens fed since the
    layer was built, so an attention that read them alone would answer as if the compressed entries were not there.
    vkv's attention function reads the layer they name (`RAGGED_TAG`) as a plain tensor (`plain()`); any other
    computation on them raises, naming the fix, instead of answering without the context."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in _METADATA:  # shape, dtype, device, size: what a caller checks before it computes
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        for keys in [*args, *(kwargs or {}).values()]:
            if isinstance(keys, RaggedKeys):
                keys.undo()
        raise VkvError(
            "this model's attention does not read a RaggedCache and would ignore its compressed entries: call "
            "vkv.use_ragged_attention(model) once before using the cache (vkv.compress does), with the model "
            "loaded with attn_implementation='sdpa' or 'eager'"
        )

    def undo(self) -> None:
        """Remove the tokens the `update()` that returned these keys appended (once), so that a refused forward
        leaves the cache as it was."""
        fed = getattr(self, "vkv_fed", 0)
        if fed:
            self.vkv_fed = 0
            getattr(self, RAGGED_TAG).crop(-fed)

    def plain(self) -> torch.Tensor:
        """The same keys as an ordinary tensor (no copy), for vkv's attention function."""
        return self.as_subclass(torch.Tensor)


_METADATA = (
    torch.Tensor.shape.__get__,
    torch.Tensor.dtype.__get__,
    torch.Tensor.device.__get__,
    torch.Tensor.size,
    torch.Tensor.dim,
    torch.Tensor.__repr__,
)


class RaggedLayer(CacheLayerMixin):
    """One layer of a RaggedCache: the entries it was built with (flat per-head ones and dense ones, never changed),
    the tokens fed since, and the logical position."""

    is_sliding = False
    is_croppable = True

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        bias: torch.Tensor | None = None,
        flat: FlatHeads | None = None,
        position: int = 0,
    ):
        """`keys`/`values` `[batch, kv_heads, loaded, head_dim]`: the dense entries it is built with; `bias` `[1 or
        batch, kv_heads, loaded]` float32 their biases (None: none); `flat` the per-head entries; `position` the
        logical position of the first token fed after them."""
        super().__init__()
        if keys.dim() != 4 or values.shape != keys.shape:
            raise VkvError(
                f"field keys: dense keys {tuple(keys.shape)} and values {tuple(values.shape)} must be equal "
                "[batch, kv_heads, length, head_dim]"
            )
        if bias is not None and (
            bias.dim() != 3 or bias.shape[0] not in (1, keys.shape[0]) or bias.shape[1:] != keys.shape[1:3]
        ):
            raise VkvError(
                f"field bias: a dense bias {tuple(bias.shape)} must be [1 or batch, kv_heads, length] with "
                f"[kv_heads, length] = {list(keys.shape[1:3])}"
            )
        if flat is not None and (flat.kv_heads != keys.shape[1] or flat.keys.shape[-1] != keys.shape[-1]):
            raise VkvError(
                f"field offsets: flat entries for {flat.kv_heads} heads of size {flat.keys.shape[-1]} do not match "
                f"the dense part's {keys.shape[1]} heads of size {keys.shape[-1]}"
            )
        self.keys, self.values, self.bias, self.flat = keys, values, bias, flat
        self.new_keys, self.new_values = keys[:, :, :0], values[:, :, :0]  # [batch, kv_heads, fed, head_dim]
        self.position = position
        self.device = keys.device
        self.is_initialized = True

    # ---- transformers' layer API ----------------------------------------------------------------------------
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: a RaggedLayer is built holding its entries."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Append the new tokens' K/V `[batch, kv_heads, n, head_dim]` to those fed since the layer was built; returns
        them all, the keys as RaggedKeys tagged with this layer for vkv's attention function (which reads the built
        entries too; any other attention raises on them)."""
        if key_states.shape[0] != self.new_keys.shape[0] and self.new_keys.shape[0] == 1:  # first feed of a batch
            self.batch_repeat_interleave(key_states.shape[0])
        self.new_keys = torch.cat([self.new_keys, key_states.to(self.keys.dtype)], dim=-2)
        self.new_values = torch.cat([self.new_values, value_states.to(self.values.dtype)], dim=-2)
        keys = self.new_keys.as_subclass(RaggedKeys)  # read by vkv's attention only: others raise, never ignore us
        setattr(keys, RAGGED_TAG, self)
        keys.vkv_fed = key_states.shape[-2]  # what `undo()` removes if an attention other than vkv's refuses them
        return keys, self.new_values

    def get_seq_length(self) -> int:
        """The logical position of the next token."""
        return self.position + self.appended

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The mask transformers builds covers the tokens fed since the layer was built and the new ones, at logical
        indices from `position` on (so a 2-d padding mask over the whole logical length is read where it belongs);
        every built entry is visible to every new token, with its bias. No new token is a caller's mistake, refused:
        `generate()` skips as already cached the first `get_seq_length()` ids it is given."""
        if query_length == 0:
            raise VkvError(
                f"no new tokens reach the cache, which covers {self.get_seq_length()} positions: model.generate() "
                "skips that many ids as already cached, so pass the whole conversation's ids (the chat template's, "
                "compressed part included) followed by the new ones"
            )
        return self.appended + query_length, self.position

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        """Remove the last `-tokens_to_remove` tokens fed (transformers' convention: a negative count); the entries the
        layer was built with are never removed."""
        if tokens_to_remove > 0:
            raise VkvError("crop takes a negative count of tokens to remove")
        remove = -tokens_to_remove
        if remove > self.appended:
            raise VkvError(
                f"cannot remove {remove} tokens: only {self.appended} were fed after the cache was built, and the "
                "entries it was built with are not removable"
            )
        if remove:
            keep = self.appended - remove  # a copy, so that the removed tokens' memory is freed
            self.new_keys = self.new_keys[:, :, :keep].clone()
            self.new_values = self.new_values[:, :, :keep].clone()

    def reset(self) -> None:
        """Back to the entries the layer was built with."""
        self.crop(-self.appended)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat the tokens fed in the batch dimension (the built entries are shared by every row)."""
        self.new_keys = self.new_keys.repeat_interleave(repeats, dim=0)
        self.new_values = self.new_values.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.new_keys, self.new_values = self.new_keys[indices, ...], self.new_values[indices, ...]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.new_keys = self.new_keys.index_select(0, beam_idx.to(self.new_keys.device))
        self.new_values = self.new_values.index_select(0, beam_idx.to(self.new_values.device))

    def offload(self):
        raise VkvError("a RaggedCache is not offloaded layer by layer; build it on the device it decodes on")

    # ---- what vkv reads -------------------------------------------------------------------------------------
    @property
    def loaded(self) -> int:
        """Dense entries the layer was built with."""
        return self.keys.shape[2]

    @property
    def appended(self) -> int:
        """Tokens fed after the layer was built."""
        return self.new_keys.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor the layer holds."""
        tensors = (self.keys, self.values, self.bias, self.new_keys, self.new_values)
        return sum(t.nbytes for t in tensors if t is not None) + (0 if self.flat is None else self.flat.nbytes)

    def materialize(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every entry in one padded layout: flat entries first (`slots` per head), then the built dense ones, then the
        tokens fed; keys and values `[batch, kv_heads, slots + loaded + fed, head_dim]` and bias `[1, kv_heads, same]`
        float32 (−inf on padding). For analyses that score all entries at once (a copy; decoding never builds it)."""
        batch = self.new_keys.shape[0]
        keys = torch.cat([self.keys.expand(batch, -1, -1, -1), self.new_keys], dim=2)
        values = torch.cat([self.values.expand(batch, -1, -1, -1), self.new_values], dim=2)
        bias = torch.zeros(1, *keys.shape[1:3], device=keys.device)
        if self.bias is not None:
            bias[..., : self.loaded] = self.bias[:1]
        return (keys, values, bias) if self.flat is None else self.flat.before(keys, values, bias)

    @property
    def slots(self) -> int:
        """Padded width of the flat part (0 without one): where `materialize()`'s dense rows start."""
        return 0 if self.flat is None else self.flat.slots


@dataclass(frozen=True)
class SegmentMemory:
    """What one segment costs in a RaggedCache."""

    span: tuple[int, int]
    kind: str
    part: str  # "dense" or "flat"
    entries: int  # K/V rows held, summed over layers and KV heads
    nbytes: int  # its keys, values and biases


class RaggedCache(Cache):
    """A transformers Cache of RaggedLayers plus the table of what each segment it was built from costs."""

    def __init__(self, layers: Sequence[RaggedLayer], segments: Sequence[SegmentMemory] = ()):
        super().__init__(layers=list(layers))
        self.segments = list(segments)

    # ---- building -------------------------------------------------------------------------------------------
    @classmethod
    def from_segments(
        cls,
        segments: Sequence[Segment],
        next_position: int,
        shape: tuple[int, int, int],
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        padded: bool = False,
    ) -> RaggedCache:
        """The cache holding `segments` (in span order) with new tokens continuing at `next_position`; `shape` is the
        model's (layers, kv_heads, head_dim). A segment with padding (head-wise budgets: −inf biases) is kept flat,
        its entries only; every other one is dense. `padded=True` keeps every segment dense, padding included: the
        layout caches had before, kept as a reference to measure against."""
        layers, kv_heads, head_dim = shape
        for i, s in enumerate(segments):
            if tuple(s.keys.shape) != (layers, kv_heads, s.slots, head_dim):
                raise VkvError(
                    f"field segments[{i}].keys: shape {tuple(s.keys.shape)} is not [layers, kv_heads, entries, "
                    f"head_dim] for a model with {layers} layers, {kv_heads} KV heads of size {head_dim}"
                )
        reach = [None if s.bias is None else torch.isfinite(s.bias) for s in segments]
        counts = [
            (s.keys[..., 0].numel(), None if r is None else int(r.sum()), s.carries_bias)
            for s, r in zip(segments, reach)
        ]
        plan = memory_plan(counts, shape, torch.empty(0, dtype=dtype).element_size(), padded)
        is_flat = [part == "flat" for part, _, _ in plan.parts]
        dense = [s for s, f in zip(segments, is_flat) if not f]
        flat = [(s, r) for s, r, f in zip(segments, reach, is_flat) if f]
        ragged_layers = []
        for layer in range(layers):
            keys = _cat([s.keys[layer] for s in dense], (kv_heads, 0, head_dim))
            values = _cat([s.values[layer] for s in dense], (kv_heads, 0, head_dim))
            bias = None
            if plan.dense_bias:
                bias = _cat([_bias_or_zeros(s)[layer] for s in dense], (kv_heads, 0))[None].to(device, torch.float32)
            flat_heads = (
                _flat_heads([(s, r[layer], layer) for s, r in flat], kv_heads, plan.flat_bias) if flat else None
            )
            ragged_layers.append(
                RaggedLayer(
                    keys[None].to(device, dtype),
                    values[None].to(device, dtype),
                    bias,
                    None if flat_heads is None else flat_heads.to(device, dtype),
                    next_position,
                )
            )
        table = [SegmentMemory(tuple(s.span), s.kind, *p) for s, p in zip(segments, plan.parts)]
        return cls(ragged_layers, table)

    def prefix(self) -> KVPrefix:
        """The entries the cache was built with (its appended tokens excluded), flat ones kept flat: what the direct
        forward attends to when it optimises on top of this cache."""
        layers = self.layers
        keys, values = [layer.keys for layer in layers], [layer.values for layer in layers]
        bias = None if layers[0].bias is None else [layer.bias for layer in layers]
        flat = [layer.flat for layer in layers] if any(layer.flat is not None for layer in layers) else None
        return KVPrefix(keys, values, None, bias, flat)

    @classmethod
    def from_prefix(cls, prefix: KVPrefix, next_position: int) -> RaggedCache:
        """A cache holding a prefix's entries densely as they are (device, dtype, autograd and batch kept), its bias
        with them: for feeding tokens on top of entries being optimised."""
        if prefix.valid is not None:
            raise VkvError("a padded batch of prefixes cannot become one cache; feed each prefix on its own")
        if not prefix.keys:
            raise VkvError("a prefix without entries needs the model's shape; use RaggedCache.from_segments")
        bias = None if prefix.bias is None else [b.float()[:1] for b in prefix.bias]
        flat = prefix.flat or [None] * len(prefix.keys)
        return cls(
            [
                RaggedLayer(k, v, None if bias is None else bias[i], flat[i], next_position)
                for i, (k, v) in enumerate(zip(prefix.keys, prefix.values))
            ]
        )

    # ---- reading --------------------------------------------------------------------------------------------
    @property
    def position(self) -> int:
        """The logical position of the next token (transformers' `get_seq_length()`)."""
        return self.get_seq_length()

    @property
    def appended(self) -> int:
        """Tokens fed since the cache was built."""
        return self.layers[0].appended if self.layers else 0

    def fed(self, start: int = 0) -> KVPrefix:
        """The K/V of the tokens fed since the cache was built, from the `start`-th on, per layer `[batch, kv_heads, n,
        head_dim]` (views)."""
        return KVPrefix(
            [layer.new_keys[:, :, start:] for layer in self.layers],
            [layer.new_values[:, :, start:] for layer in self.layers],
        )

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor the cache holds, measured from them."""
        return sum(layer.nbytes for layer in self.layers)

    @property
    def offsets_nbytes(self) -> int:
        return sum(layer.flat.offsets.nbytes for layer in self.layers if layer.flat is not None)

    def span_nbytes(self, start: int, end: int) -> int:
        """Bytes the cache holds for the segments standing for original tokens inside [start, end): their keys,
        values and biases, plus the per-head offsets when any of them is flat."""
        inside = [s for s in self.segments if start <= s.span[0] and s.span[1] <= end]
        offsets = self.offsets_nbytes if any(s.part == "flat" for s in inside) else 0
        return sum(s.nbytes for s in inside) + offsets

    def generate_inputs(
        self, prompt: torch.Tensor | Sequence[int], attention_mask: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """The `input_ids` and `attention_mask` with which `model.generate(**inputs, cache=self)` continues this cache
        with `prompt` (ids `[n]` or `[batch, n]`, with its own 0/1 padding mask if batched). `generate()` takes the ids
        of every position the cache covers and feeds only the rest, and numbers positions by the mask: the covered
        positions get filler ids (never fed) and mask ones, so new tokens take the cache's logical positions."""
        prompt = torch.as_tensor(prompt, dtype=torch.long)
        prompt = prompt[None] if prompt.dim() == 1 else prompt
        device = self.layers[0].device
        covered = torch.zeros(prompt.shape[0], self.position, dtype=torch.long, device=device)
        mask = torch.ones_like(prompt) if attention_mask is None else torch.as_tensor(attention_mask).long()
        if mask.shape != prompt.shape:
            raise VkvError(f"field attention_mask: shape {tuple(mask.shape)} is not the prompt's {tuple(prompt.shape)}")
        return {
            "input_ids": torch.cat([covered, prompt.to(device)], dim=1),
            "attention_mask": torch.cat([torch.ones_like(covered), mask.to(device)], dim=1),
        }


@dataclass(frozen=True)
class MemoryLayout:
    """Where `RaggedCache.from_segments` keeps each segment and what it costs (`memory_plan`)."""

    parts: list[tuple[str, int, int]]  # per segment: "dense" or "flat", K/V rows held, bytes
    dense_bias: bool  # whether the dense part holds a float32 bias per entry
    flat_bias: bool  # whether the flat part does


def memory_plan(
    segments: Sequence[tuple[int, int | None, bool]], shape: tuple[int, int, int], itemsize: int, padded: bool = False
) -> MemoryLayout:
    """The layout from counts alone (what a cache file's header records): per segment (slots summed over layers and KV
    heads, entries summed the same way or None when no slot is padding, whether an entry carries a nonzero bias). A
    segment with padding is flat: its entries only, each with a float32 bias when any flat segment carries one. Every
    other one is dense: all its slots, each with a float32 bias when any dense segment carries one or, in the padded
    layout, has padding (−inf). Per-head offsets (`offsets_nbytes`) are not included."""
    flat = [not padded and reached is not None and reached < slots for slots, reached, _ in segments]
    dense_bias = any(
        biased or (reached is not None and reached < slots)
        for (slots, reached, biased), f in zip(segments, flat)
        if not f
    )
    flat_bias = any(biased for (_, _, biased), f in zip(segments, flat) if f)
    kv_row = kv_row_bytes(shape, itemsize)
    parts = []
    for (slots, reached, _), f in zip(segments, flat):
        rows = reached if f else slots
        parts.append(("flat" if f else "dense", rows, rows * (kv_row + (4 if (flat_bias if f else dense_bias) else 0))))
    return MemoryLayout(parts, dense_bias, flat_bias)


def kv_row_bytes(shape: tuple[int, int, int], itemsize: int) -> int:
    """One entry's key and value in one layer and KV head (`shape`: layers, kv_heads, head_dim)."""
    return 2 * shape[2] * itemsize


def offsets_nbytes(shape: tuple[int, int, int]) -> int:
    """The per-head offsets of a cache with flat entries: `[kv_heads + 1]` int64 per layer."""
    return shape[0] * (shape[1] + 1) * 8


def _cat(tensors: list[torch.Tensor], empty: tuple[int, ...]) -> torch.Tensor:
    """`tensors` concatenated along dim 1 (entries), or an empty float32 tensor of shape `empty`."""
    return torch.cat(tensors, dim=1) if tensors else torch.zeros(empty)


def _bias_or_zeros(segment: Segment) -> torch.Tensor:
    return torch.zeros(segment.keys.shape[:3]) if segment.bias is None else segment.bias.float()


def _flat_heads(parts: list[tuple[Segment, torch.Tensor, int]], kv_heads: int, with_bias: bool) -> FlatHeads:
    """Each head's entries of every segment in `parts` (segment, the slots holding entries `[kv_heads, slots]`,
    layer), head by head and in segment order within a head; their biases when `with_bias` (else they are all 0)."""
    keys, values, bias, counts = [], [], [], []
    for head in range(kv_heads):
        rows = [(s, reach[head], layer) for s, reach, layer in parts]
        keys += [s.keys[layer, head][r] for s, r, layer in rows]
        values += [s.values[layer, head][r] for s, r, layer in rows]
        bias += [s.bias[layer, head][r].float() for s, r, layer in rows]
        counts.append(sum(int(r.sum()) for _, r, _ in rows))
    offsets = torch.tensor([0, *counts]).cumsum(0)
    return FlatHeads(torch.cat(keys), torch.cat(values), torch.cat(bias) if with_bias else None, offsets)
