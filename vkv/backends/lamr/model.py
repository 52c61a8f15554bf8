"""The LaMR network: a decoder backbone read at three depths, one fusion block, per-rubric CRF heads, a
softmax gate, a fused CRF, and the backbone's own yes/no relevance judgment.

Split in two so training can cache what a frozen backbone produces:
- `RerankerBackbone`: token features (hidden states at 25%, 50% and 100% depth, concatenated) and the
  yes/no logits of the last token (its final hidden state against the "no"/"yes" output embeddings);
- `LaMRHead`: everything trainable above it. With one rubric there is no gate and no final CRF: the
  rubric's own CRF decides, which is SWE-Pruner's architecture.

One addition to the paper's architecture, on by default (`depth_norm`): each depth's hidden state is
divided by its root-mean-square before concatenation (no parameters). Decoder residual streams carry
massive activations (single values orders of magnitude above the typical RMS), and fed raw into the fusion
attention they swamp everything else: on the demo corpus a head on raw features did not settle on its own
training examples where one with the normalisation did (evals/RESULTS.md, end of section 'Stage 2: every method
at 2×, 3.2× and 4.8×'). SWE-Pruner's weights were trained without it, so their loader turns it off.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import nn

from vkv.backends.lamr.crf import LinearChainCRF
from vkv.backends.lamr.prompt import answer_token_ids
from vkv.errors import VkvError
from vkv.lm.load import resolve_model_path

DEFAULT_BACKBONE = "Qwen/Qwen3-Reranker-0.6B"
BACKBONE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LaMRConfig:
    backbone: str = DEFAULT_BACKBONE
    rubrics: tuple[str, ...] = ("semantic", "dependency")
    layer_fractions: tuple[float, ...] = (0.25, 0.5, 1.0)
    fusion_heads: int = 8
    head_hidden: int = 256
    gate_hidden: int = 128
    dropout: float = 0.4
    depth_norm: bool = True  # RMS-normalise each depth before fusion (see module docstring)
    trainable_top_layers: int = 2
    backbone_dtype: str = "float32"
    max_length: int = 8192
    chunk_overlap: int = 50
    threshold: float = 0.4

    def __post_init__(self):
        if not self.rubrics or len(set(self.rubrics)) != len(self.rubrics):
            raise VkvError(f"rubrics must be one or more distinct names, got {list(self.rubrics)}")
        bad = [r for r in self.rubrics if not r.isidentifier()]
        if bad:
            raise VkvError(f"rubric names must be identifiers (letters, digits, _), got {bad}")
        if self.backbone_dtype not in BACKBONE_DTYPES:
            raise VkvError(f"backbone_dtype must be one of {', '.join(BACKBONE_DTYPES)}, got '{self.backbone_dtype}'")
        if self.trainable_top_layers < 0:
            raise VkvError(f"trainable_top_layers must be ≥ 0, got {self.trainable_top_layers}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> LaMRConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise VkvError(f"{source}: unknown LaMR config field(s) {', '.join(unknown)}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**values)


def fusion_layer_indices(num_layers: int, fractions: tuple[float, ...]) -> list[int]:
    """hidden_states indices (0 = embeddings) at each depth fraction: 28 layers → 7, 14, 28."""
    return [max(1, int(num_layers * f)) for f in fractions]


# ---- head ----------------------------------------------------------------------------------------------
class FusionBlock(nn.Module):
    """Bidirectional self-attention over the concatenated depths, residual, LayerNorm, dropout."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        if width % heads:
            raise VkvError(f"fusion width {width} is not divisible by fusion_heads {heads}; pick another head count")
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm = nn.LayerNorm(width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        attended, _ = self.attention(x, x, x, key_padding_mask=padding, need_weights=False)
        return self.dropout(self.norm(attended + x))


class EmissionHead(nn.Sequential):
    """LayerNorm → Linear → GELU → Dropout → Linear to (prune, keep) emissions (SWE-Pruner's layout)."""

    def __init__(self, width: int, hidden: int, dropout: float):
        super().__init__(
            nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, 2)
        )


class RubricGate(nn.Module):
    """Per-token softmax weights over rubrics, from the (query-conditioned) fused features."""

    def __init__(self, width: int, hidden: int, rubrics: int):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, rubrics))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.net(x), dim=-1)


@dataclass
class HeadOutput:
    rubric_emissions: torch.Tensor  # [B, T, R, 2]
    gate: torch.Tensor | None  # [B, T, R]; None with one rubric
    fused: torch.Tensor  # [B, T, 2]


class LaMRHead(nn.Module):
    def __init__(self, config: LaMRConfig, width: int):
        super().__init__()
        self.rubrics = tuple(config.rubrics)
        self.depths = len(config.layer_fractions) if config.depth_norm else 0
        self.fusion = FusionBlock(width, config.fusion_heads, config.dropout)
        self.heads = nn.ModuleDict({r: EmissionHead(width, config.head_hidden, config.dropout) for r in self.rubrics})
        self.crfs = nn.ModuleDict({r: LinearChainCRF(2) for r in self.rubrics})
        multi = len(self.rubrics) > 1
        self.gate = RubricGate(width, config.gate_hidden, len(self.rubrics)) if multi else None
        self.final_crf = LinearChainCRF(2) if multi else None

    @property
    def decision_crf(self) -> LinearChainCRF:
        return self.final_crf if self.final_crf is not None else self.crfs[self.rubrics[0]]

    def forward(self, features: torch.Tensor, padding: torch.Tensor) -> HeadOutput:
        if self.depths:
            features = normalise_depths(features, self.depths)
        fused_features = self.fusion(features, padding)
        emissions = torch.stack([self.heads[r](fused_features) for r in self.rubrics], dim=2)
        if self.gate is None:
            return HeadOutput(emissions, None, emissions[:, :, 0])
        gate = self.gate(fused_features)
        fused = (gate.unsqueeze(-1) * emissions).sum(dim=2)
        return HeadOutput(emissions, gate, fused)


def normalise_depths(features: torch.Tensor, depths: int) -> torch.Tensor:
    """Divide each depth's slice of the concatenated features by its RMS over the hidden dimension."""
    shape = features.shape
    split = features.reshape(*shape[:-1], depths, shape[-1] // depths).float()
    split = split * torch.rsqrt(split.pow(2).mean(dim=-1, keepdim=True) + 1e-6)
    return split.reshape(shape).to(features.dtype)


def gate_balance_loss(gate: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log R − H(mean gate over valid positions): zero when rubrics are used evenly, log R at collapse."""
    weights = mask.to(gate.dtype).unsqueeze(-1)
    mean = (gate * weights).sum(dim=(0, 1)) / weights.sum().clamp(min=1.0)
    entropy = -(mean * mean.clamp(min=1e-12).log()).sum()
    return math.log(gate.shape[-1]) - entropy


# ---- backbone --------------------------------------------------------------------------------------------
@dataclass
class BackboneOutput:
    features: torch.Tensor  # [B, T, 3H] float32
    answer_logits: torch.Tensor  # [B, 2] (no, yes) at the last real token


class RerankerBackbone(nn.Module):
    """A Hugging Face decoder's base model; only its top `trainable_top_layers` layers can learn."""

    def __init__(self, base: nn.Module, answer_vectors: torch.Tensor, layer_fractions: tuple[float, ...]):
        super().__init__()
        self.model = base
        self.register_buffer("answer_vectors", answer_vectors.detach().clone(), persistent=False)
        self.layer_indices = fusion_layer_indices(base.config.num_hidden_layers, tuple(layer_fractions))
        self.width = base.config.hidden_size * len(self.layer_indices)

    def decoder_layers(self) -> nn.ModuleList:
        """The model's list of decoder layers, found by shape, not by one architecture's attribute name."""
        count = self.model.config.num_hidden_layers
        for module in self.model.modules():
            if isinstance(module, nn.ModuleList) and len(module) == count:
                return module
        raise VkvError(f"could not find the {count} decoder layers of backbone {type(self.model).__name__}")

    def set_trainable_top_layers(self, count: int) -> list[str]:
        """Freeze everything, then unfreeze the last `count` decoder layers; returns their parameter names."""
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        if count == 0:
            return []
        layers = self.decoder_layers()
        if count > len(layers):
            raise VkvError(f"trainable_top_layers {count} exceeds the backbone's {len(layers)} layers")
        chosen = {id(p) for layer in list(layers)[-count:] for p in layer.parameters()}
        names = []
        for name, parameter in self.model.named_parameters():
            if id(parameter) in chosen:
                parameter.requires_grad_(True)
                names.append(name)
        return names

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> BackboneOutput:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
        states = out.hidden_states
        features = torch.cat([states[i].float() for i in self.layer_indices], dim=-1)
        last = (attention_mask.sum(dim=1) - 1).clamp(min=0)
        final = states[-1][torch.arange(input_ids.shape[0], device=input_ids.device), last].float()
        return BackboneOutput(features, final @ self.answer_vectors.float().T)


def load_backbone(name: str, dtype: str = "float32", device: str | torch.device = "cpu", weights: bool = True):
    """(base model, tokenizer) for a hub id, a local directory or a vkv alias such as smollm2-135m.

    weights=False builds the architecture from its config only (a checkpoint will supply the weights).
    """
    # heavy: building a corpus or reading a checkpoint's manifest imports this package and needs no transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path, local = resolve_model_path(name)
    torch_dtype = BACKBONE_DTYPES[dtype]
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
        if weights:
            causal = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, local_files_only=local)
        else:
            config = AutoConfig.from_pretrained(path, local_files_only=local)
            causal = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    except OSError as exc:
        raise VkvError(f"could not load backbone '{name}': {str(exc).splitlines()[0]}") from exc
    return causal.to(device), tokenizer


def answer_vectors(causal, no_id: int, yes_id: int) -> torch.Tensor:
    """Rows of the output embedding (the tied input embedding for tied models) for "no" and "yes"."""
    table = causal.get_output_embeddings() or causal.get_input_embeddings()
    return table.weight[[no_id, yes_id]]


# ---- whole model -------------------------------------------------------------------------------------------
@dataclass
class LaMROutput:
    head: HeadOutput
    answer_logits: torch.Tensor  # [B, 2]

    @property
    def relevance(self) -> torch.Tensor:
        """P(yes) per row."""
        return torch.softmax(self.answer_logits.float(), dim=-1)[:, 1]


class LaMRModel(nn.Module):
    def __init__(self, config: LaMRConfig, backbone: RerankerBackbone, tokenizer):
        super().__init__()
        self.config = config
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.head = LaMRHead(config, backbone.width)
        self.trainable_backbone_parameters = backbone.set_trainable_top_layers(config.trainable_top_layers)

    @property
    def device(self) -> torch.device:
        return next(self.head.parameters()).device

    def train(self, mode: bool = True) -> LaMRModel:
        super().train(mode)
        self.backbone.eval()  # backbone dropout stays off even while its top layers learn (as SWE-Pruner)
        return self

    @property
    def backbone_frozen(self) -> bool:
        return not self.trainable_backbone_parameters

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> LaMROutput:
        encoded = self.backbone(input_ids, attention_mask)
        return self.run_head(encoded.features, attention_mask, encoded.answer_logits)

    def run_head(self, features: torch.Tensor, attention_mask: torch.Tensor, answer_logits: torch.Tensor) -> LaMROutput:
        return LaMROutput(self.head(features, attention_mask == 0), answer_logits)


def build_model(config: LaMRConfig, device: str | torch.device = "cpu", backbone_weights: bool = True) -> LaMRModel:
    """A fresh LaMR model (head randomly initialised) on the named backbone."""
    causal, tokenizer = load_backbone(config.backbone, config.backbone_dtype, device, weights=backbone_weights)
    return assemble(config, causal, tokenizer, device)


def assemble(config: LaMRConfig, causal, tokenizer, device: str | torch.device = "cpu") -> LaMRModel:
    """LaMR around an already constructed causal LM (used by tests with a tiny random backbone)."""
    no_id, yes_id = answer_token_ids(tokenizer)
    backbone = RerankerBackbone(causal.base_model, answer_vectors(causal, no_id, yes_id), config.layer_fractions)
    model = LaMRModel(config, backbone, tokenizer)
    return model.to(device)
