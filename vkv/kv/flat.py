"""FlatHeads: one layer's compressed entries kept per KV head, flattened, so that heads with fewer entries take less
memory (head-wise budgets keep a different number in each head)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.errors import VkvError

MASKED = float("-inf")  # the bias of a padding slot: no query ever attends to it


@dataclass
class FlatHeads:
    """One layer's entries kept per KV head, flattened: head h owns rows `offsets[h]:offsets[h + 1]`."""

    keys: torch.Tensor  # [N, head_dim], post-RoPE
    values: torch.Tensor  # [N, head_dim]
    bias: torch.Tensor | None  # [N] float32, added to every later query's logit for the entry (None: all 0)
    offsets: torch.Tensor  # [kv_heads + 1] int64, offsets[0] = 0, offsets[-1] = N

    def __post_init__(self) -> None:
        n = self.keys.shape[0]
        offsets = self.offsets.tolist()
        if (
            self.offsets.dim() != 1
            or offsets[0] != 0
            or offsets[-1] != n
            or any(b < a for a, b in zip(offsets, offsets[1:]))
            or self.values.shape != self.keys.shape
            or (self.bias is not None and tuple(self.bias.shape) != (n,))
        ):
            bias = None if self.bias is None else tuple(self.bias.shape)
            raise VkvError(
                f"field offsets: per-head offsets {offsets} do not match flat entries of keys "
                f"{tuple(self.keys.shape)}, values {tuple(self.values.shape)} and bias {bias}"
            )
        self.counts = tuple(b - a for a, b in zip(offsets, offsets[1:]))  # entries per head, as Python ints

    @property
    def kv_heads(self) -> int:
        return len(self.counts)

    @property
    def slots(self) -> int:
        """The longest head's entries: the width `padded()` gives every head."""
        return max(self.counts)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.keys, self.values, self.bias, self.offsets) if t is not None)

    def head_bias(self) -> torch.Tensor:
        """`[kv_heads, N]` float32: each entry's bias (0 without one) in its own head's row, −inf in the others, so one
        product of every head's queries with all N entries attends each head to its own (no padded copy)."""
        n = self.keys.shape[0]
        # each entry's head from the offsets on their own device: no host list, no sync in a decoding step
        owner = torch.searchsorted(
            self.offsets[1:].to(self.keys.device), torch.arange(n, device=self.keys.device), right=True
        )
        own = self.bias.float() if self.bias is not None else torch.zeros(n, device=self.keys.device)
        out = torch.full((self.kv_heads, n), MASKED, device=self.keys.device)
        return out.scatter_(0, owner[None], own[None])

    def padded(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keys and values `[1, kv_heads, slots, head_dim]` and bias `[1, kv_heads, slots]` float32 (−inf where a
        head has fewer entries; the padding keys and values are zeros): the temporary attention reads."""
        pad = torch.nn.utils.rnn.pad_sequence
        keys = pad(self.keys.split(self.counts), batch_first=True)[None]
        values = pad(self.values.split(self.counts), batch_first=True)[None]
        if self.bias is not None:
            bias = pad(self.bias.float().split(self.counts), batch_first=True, padding_value=MASKED)
        else:
            real = torch.arange(self.slots, device=self.keys.device) < self.offsets.diff()[:, None]
            bias = torch.zeros(real.shape, device=self.keys.device).masked_fill_(~real, MASKED)
        return keys, values, bias[None]

    def before(
        self, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """These entries, padded to the longest head, in front of dense keys and values `[batch, kv_heads, L,
        head_dim]` with their bias `[1 or batch, kv_heads, L]` (None: 0): one layer's entries as one tensor each, a
        temporary for whoever attends to all of them at once."""
        flat_keys, flat_values, flat_bias = self.padded()
        batch = keys.shape[0]
        dense_bias = torch.zeros(1, *keys.shape[1:3], device=flat_bias.device) if bias is None else bias.float()
        return (
            torch.cat([flat_keys.to(keys.dtype).expand(batch, -1, -1, -1), keys], dim=2),
            torch.cat([flat_values.to(values.dtype).expand(batch, -1, -1, -1), values], dim=2),
            torch.cat([flat_bias.expand(dense_bias.shape[0], -1, -1), dense_bias], dim=2),
        )

    def to(self, device: torch.device | str, dtype: torch.dtype) -> FlatHeads:
        return FlatHeads(
            self.keys.to(device, dtype),
            self.values.to(device, dtype),
            None if self.bias is None else self.bias.to(device, torch.float32),
            self.offsets.to(device),
        )
