"""How far virtual tokens' K/V are from their targets, per layer: for one span (`layer_losses`) and for a batch of
independent spans padded to one length (`Batch`, `AttentionBatch`), where padded tokens and reference queries count
for nothing, so that each span's loss is the one it would have alone."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vkv.compress.targets import TARGET_KINDS, AttentionTargets, Targets
from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.lm.frozen import FrozenLM

LOSSES = ("mse", "cosine")


def layer_losses(keys: list[torch.Tensor], values: list[torch.Tensor], targets: Targets, loss: str) -> torch.Tensor:
    """Per-layer loss `[layers]` between the virtual tokens' K/V (lists of `[1, H, k, D]`, keys post-RoPE
    unless the target is pre-RoPE) and the targets, read-out error included for attention targets."""
    device = values[0].device
    v = torch.cat(values).float()  # [layers, H, k, D]
    per_layer = _distance(v, targets.values.to(device), targets.value_scale.to(device), loss)
    if targets.keys is not None:
        k = torch.cat(keys).float()
        per_layer = 0.5 * (per_layer + _distance(k, targets.keys.to(device), targets.key_scale.to(device), loss))
    if targets.attention is not None:
        attention = AttentionBatch.build([targets.attention], targets.k, device)
        per_layer = (
            per_layer
            + _attention_distance(
                torch.cat(keys).float()[None], v[None], attention, targets.value_scale.to(device)[None]
            )[0]
        )
    return per_layer


def _distance(x: torch.Tensor, target: torch.Tensor, scale: torch.Tensor, loss: str) -> torch.Tensor:
    if loss == "cosine":
        return 1 - torch.nn.functional.cosine_similarity(x, target, dim=-1).mean(dim=(1, 2))
    return (x - target).pow(2).mean(dim=(1, 2, 3)) / scale


def _masked_distance(x, target, scale, loss: str, token_mask: torch.Tensor | None) -> torch.Tensor:
    """`layer_losses`' distance for a batch: x, target `[B, layers, H, n, D]`, scale `[B, layers]` → `[B, layers]`;
    padded tokens (token_mask `[B, n]` False) count for nothing."""
    if token_mask is None:
        if loss == "cosine":
            return 1 - torch.nn.functional.cosine_similarity(x, target, dim=-1).mean(dim=(2, 3))
        return (x - target).pow(2).mean(dim=(2, 3, 4)) / scale
    weight = token_mask.to(x.dtype)[:, None, None, :]  # [B, 1, 1, n]
    count = weight.sum(-1) * x.shape[2]  # real tokens × heads, [B, 1, 1]
    if loss == "cosine":
        cos = torch.nn.functional.cosine_similarity(x, target, dim=-1)
        return 1 - (cos * weight).sum(dim=(2, 3)) / count[..., 0]
    squared = (x - target).pow(2).sum(-1)
    return (squared * weight).sum(dim=(2, 3)) / (count[..., 0] * x.shape[-1]) / scale


def _attention_distance(
    keys: torch.Tensor, values: torch.Tensor, target: AttentionBatch, value_scale: torch.Tensor
) -> torch.Tensor:
    """Per-layer read-out error `[B, layers]` of virtual keys/values `[B, layers, kv_heads, n, D]` (post-RoPE):
    the output error (variance-normalised like the V loss) plus the squared log-normaliser error, in nats²,
    averaged over the reference queries."""
    depth = keys.shape[1]
    scores = target.queries[:, :depth] @ keys.transpose(-1, -2) + target.log_mass[:, None, None, None, :]
    outputs = scores.softmax(-1) @ values
    output_error = (outputs - target.outputs[:, :depth]).pow(2).mean(-1) / value_scale[:, :depth, None, None]
    norm_error = (scores.logsumexp(-1) - target.log_norm[:, :depth]).pow(2)
    error = output_error + norm_error  # [B, layers, kv_heads, queries]
    if target.query_mask is None:
        return error.mean(dim=(2, 3)) * target.weight[:, None]
    mask = target.query_mask.to(error.dtype)[:, None, None, :]
    return (error * mask).sum(dim=(2, 3)) / (mask.sum(-1) * error.shape[2]) * target.weight[:, None]


@dataclass
class AttentionBatch:
    """`AttentionTargets` of a batch, padded: absent virtual tokens get log-mass -inf (never read), absent
    reference queries a False `query_mask`."""

    queries: torch.Tensor  # [B, layers, kv_heads, q, D]
    outputs: torch.Tensor  # [B, layers, kv_heads, q, D]
    log_norm: torch.Tensor  # [B, layers, kv_heads, q]
    log_mass: torch.Tensor  # [B, n]
    query_mask: torch.Tensor | None  # [B, q]
    weight: torch.Tensor  # [B]

    @classmethod
    def build(cls, targets: list[AttentionTargets], n: int, device: torch.device) -> AttentionBatch:
        counts = [t.count for t in targets]
        q = max(counts)

        def pad(x: torch.Tensor, dim: int, size: int, fill: float = 0.0) -> torch.Tensor:
            shape = list(x.shape)
            shape[dim] = size - x.shape[dim]
            return torch.cat([x.float(), x.new_full(shape, fill).float()], dim=dim)

        return cls(
            queries=torch.stack([pad(t.queries, 2, q) for t in targets]).to(device),
            outputs=torch.stack([pad(t.outputs, 2, q) for t in targets]).to(device),
            log_norm=torch.stack([pad(t.log_norm, 2, q) for t in targets]).to(device),
            log_mass=torch.stack([pad(t.log_mass, 0, n, float("-inf")) for t in targets]).to(device),
            query_mask=None
            if len(set(counts)) == 1
            else (torch.arange(q)[None] < torch.tensor(counts)[:, None]).to(device),
            weight=torch.tensor([t.weight for t in targets], dtype=torch.float32, device=device),
        )

    def select(self, index: torch.Tensor, n: int) -> AttentionBatch:
        mask = None if self.query_mask is None else self.query_mask[index]
        return AttentionBatch(
            self.queries[index],
            self.outputs[index],
            self.log_norm[index],
            self.log_mass[index, :n],
            None if mask is None or bool(mask.all()) else mask,
            self.weight[index],
        )


@dataclass
class Batch:
    """Problems padded to one virtual-token count n and one prefix length, on the model's device."""

    prefix: KVPrefix
    positions: torch.Tensor  # [B, n]
    token_mask: torch.Tensor | None  # [B, n] True for real virtual tokens; None when none is padded
    values: torch.Tensor  # [B, layers, kv_heads, n, D]
    value_scale: torch.Tensor  # [B, layers]
    keys: torch.Tensor | None
    key_scale: torch.Tensor | None
    kind: str
    sizes: list[int]
    attention: AttentionBatch | None = None

    @classmethod
    def build(
        cls,
        lm: FrozenLM,
        problems: list[tuple[KVPrefix, Targets, torch.Tensor]],
        prefix_dtype: torch.dtype | None = None,
    ) -> Batch:
        kinds = {t.kind for _, t, _ in problems}
        if len(kinds) != 1:
            raise VkvError(f"a batch must share one target kind, got {', '.join(sorted(kinds))}")
        sizes = [t.k for _, t, _ in problems]
        n, dev = max(sizes), lm.device

        def padded(tensors: list[torch.Tensor], dim: int, fill: float = 0.0) -> torch.Tensor:
            out = []
            for x in tensors:
                pad = list(x.shape)
                pad[dim] = n - x.shape[dim]
                out.append(torch.cat([x, x.new_full(pad, fill)], dim=dim))
            return torch.stack(out).to(dev)

        prefixes = [p for p, _, _ in problems]
        prefix = prefixes[0] if len(prefixes) == 1 else KVPrefix.stack(prefixes)
        targets = [t for _, t, _ in problems]
        positions = [p.float().reshape(-1) for _, _, p in problems]
        with_keys = targets[0].keys is not None
        with_attention = targets[0].attention is not None
        return cls(
            prefix=prefix.to(dev, prefix_dtype or lm.dtype),
            positions=padded([p for p in positions], 0, fill=0.0),
            token_mask=None if len(set(sizes)) == 1 else (torch.arange(n)[None] < torch.tensor(sizes)[:, None]).to(dev),
            values=padded([t.values.float() for t in targets], 2),
            value_scale=torch.stack([t.value_scale.float() for t in targets]).to(dev),
            keys=padded([t.keys.float() for t in targets], 2) if with_keys else None,
            key_scale=torch.stack([t.key_scale.float() for t in targets]).to(dev) if with_keys else None,
            kind=targets[0].kind,
            sizes=sizes,
            attention=AttentionBatch.build([t.attention for t in targets], n, dev) if with_attention else None,
        )

    def select(self, rows: list[int]) -> Batch:
        """The sub-batch of `rows`, trimmed to their longest prefix and virtual-token count (one copy)."""
        n = max(self.sizes[r] for r in rows)
        index = torch.tensor(rows, device=self.positions.device)
        prefix = self.prefix
        if prefix.length and prefix.keys[0].shape[0] > 1:
            valid = prefix.valid[index] if prefix.valid is not None else None
            length = int(valid.sum(1).max()) if valid is not None else prefix.length
            valid = None if valid is None or bool(valid[:, :length].all()) else valid[:, :length]
            bias = None if prefix.bias is None else [b[index, :, :length] for b in prefix.bias]
            prefix = KVPrefix(
                [k[index, :, :length] for k in prefix.keys], [v[index, :, :length] for v in prefix.values], valid, bias
            )
        mask = None if self.token_mask is None else self.token_mask[index, :n]
        return Batch(
            prefix=prefix,
            positions=self.positions[index, :n],
            token_mask=None if mask is None or bool(mask.all()) else mask,
            values=self.values[index, :, :, :n],
            value_scale=self.value_scale[index],
            keys=None if self.keys is None else self.keys[index, :, :, :n],
            key_scale=None if self.key_scale is None else self.key_scale[index],
            kind=self.kind,
            sizes=[self.sizes[r] for r in rows],
            attention=None if self.attention is None else self.attention.select(index, n),
        )

    def per_layer_losses(self, lm: FrozenLM, embeddings: torch.Tensor, loss: str, last_layer: int) -> torch.Tensor:
        """Per-problem, per-layer loss `[B, last_layer + 1]` of embeddings `[B, n, hidden]`."""
        keys, values = lm.forward_kv(
            embeddings,
            self.positions,
            self.prefix,
            last_layer=last_layer,
            token_mask=self.token_mask,
            last_keys=TARGET_KINDS[self.kind].uses_keys,
            rope_keys=TARGET_KINDS[self.kind].rope_keys,
        )
        depth = last_layer + 1
        stacked_values = torch.stack(values, 1).float()
        per_layer = _masked_distance(
            stacked_values, self.values[:, :depth], self.value_scale[:, :depth], loss, self.token_mask
        )
        if self.attention is not None:
            per_layer = per_layer + _attention_distance(
                torch.stack(keys, 1).float(), stacked_values, self.attention, self.value_scale
            )
        if self.keys is not None:
            key_loss = _masked_distance(
                torch.stack(keys, 1).float(), self.keys[:, :depth], self.key_scale[:, :depth], loss, self.token_mask
            )
            per_layer = 0.5 * (per_layer + key_loss)
        return per_layer
