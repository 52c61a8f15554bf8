"""LaMR checkpoints (safetensors + JSON, never pickle), and loading SWE-Pruner's published weights.

Our layout, in a directory:
- `lamr.safetensors`: `head.*` (fusion block, rubric heads, CRFs, gate, final CRF) and `backbone.*` for the
  backbone parameters that were trained (the top layers); the rest of the backbone is re-read from
  `config.backbone`, so a checkpoint on a frozen backbone is a few tens of MB.
- `lamr.json`: format, version, the `LaMRConfig`, the trained backbone parameter names, training summary.

SWE-Pruner's layout (one `model.safetensors`, Hugging Face `ayanami-kitasan/code-pruner`, MIT): the whole
backbone as `backbone.*` (AutoModel keys), `fusion_layers.0.*` (nn.MultiheadAttention), `fusion_norms.0.*`,
`compression_head.feature_extractor.{0,1,4}.*` (LayerNorm, Linear, -, -, Linear) and
`compression_head.crf.{transitions,start_transitions,end_transitions}`. Their loss indexes transitions as
[to, from]; ours are [from, to], so the matrix is transposed on load. It loads as the one-rubric
configuration, whose single CRF is then decoded with Viterbi as it should be.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import hf_hub_download
from safetensors.torch import load_file, save_file

from vkv.backends.lamr.model import DEFAULT_BACKBONE, LaMRConfig, LaMRModel, build_model
from vkv.backends.lamr.prompt import answer_token_ids
from vkv.errors import VkvError
from vkv.io import atomic_path, write_json_atomic

FORMAT = "vkv-lamr"
VERSION = 1
WEIGHTS_FILE = "lamr.safetensors"
CONFIG_FILE = "lamr.json"
SWE_PRUNER_HUB_ID = "ayanami-kitasan/code-pruner"
SWE_PRUNER_RUBRIC = "semantic"


def save_checkpoint(model: LaMRModel, directory: str | Path, extra: dict[str, Any] | None = None) -> Path:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = {f"head.{k}": v for k, v in model.head.state_dict().items()}
    named = dict(model.backbone.model.named_parameters())
    for name in model.trainable_backbone_parameters:
        state[f"backbone.{name}"] = named[name]
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    with atomic_path(out / WEIGHTS_FILE, "cache") as tmp:  # safetensors, as a cache is
        save_file(tensors, str(tmp), metadata={"format": FORMAT, "version": str(VERSION)})
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "config": model.config.to_dict(),
        "backbone_parameters": list(model.trainable_backbone_parameters),
        **(extra or {}),
    }
    write_json_atomic(out / CONFIG_FILE, manifest)
    return out


def read_manifest(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(checkpoint directory, parsed lamr.json) for a directory or the path of its lamr.json."""
    given = Path(path).expanduser()
    directory = given.parent if given.name == CONFIG_FILE else given
    manifest_path = directory / CONFIG_FILE
    if not manifest_path.is_file():
        raise VkvError(f"{directory} is not a LaMR checkpoint: {CONFIG_FILE} is missing")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise VkvError(f"{manifest_path} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if manifest.get("format") != FORMAT:
        raise VkvError(f"{manifest_path}: field 'format' must be '{FORMAT}', got {manifest.get('format')!r}")
    if manifest.get("version") != VERSION:
        raise VkvError(
            f"{manifest_path}: field 'version' is {manifest.get('version')!r}; this vkv reads version {VERSION}"
        )
    if not isinstance(manifest.get("config"), dict):
        raise VkvError(f"{manifest_path}: field 'config' must be an object")
    return directory, manifest


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu", backbone: str | None = None
) -> tuple[LaMRModel, dict[str, Any]]:
    """Model in eval mode and its manifest; `backbone` overrides where the base weights are read from."""
    directory, manifest = read_manifest(path)
    config = LaMRConfig.from_dict(manifest["config"], source=str(directory / CONFIG_FILE))
    if backbone is not None:
        config = replace(config, backbone=backbone)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise VkvError(f"{directory} is not a LaMR checkpoint: {WEIGHTS_FILE} is missing")
    tensors = load_file(str(weights))
    model = build_model(config, device)
    head_state = {k[len("head.") :]: v for k, v in tensors.items() if k.startswith("head.")}
    _load_strict(model.head, head_state, weights, "head")
    backbone_state = {k[len("backbone.") :]: v for k, v in tensors.items() if k.startswith("backbone.")}
    _load_partial(model.backbone.model, backbone_state, weights)
    return model.eval(), manifest


def load_swe_pruner(
    weights: str | Path = SWE_PRUNER_HUB_ID,
    backbone: str = DEFAULT_BACKBONE,
    device: str | torch.device = "cpu",
    backbone_dtype: str = "float32",
) -> LaMRModel:
    """SWE-Pruner weights (a model.safetensors, its directory, or the hub id) as one-rubric LaMR.

    `backbone` supplies the architecture config and tokenizer only; every backbone weight comes from the
    checkpoint.
    """
    file = _swe_pruner_file(weights)
    tensors = load_file(str(file))
    if tensors and all(k.startswith("model.") for k in tensors):
        tensors = {k[len("model.") :]: v for k, v in tensors.items()}
    if "compression_head.feature_extractor.1.weight" not in tensors:
        raise VkvError(f"{file} does not have SWE-Pruner's key layout (no compression_head.feature_extractor.1.weight)")
    hidden = tensors["compression_head.feature_extractor.1.weight"].shape[0]
    config = LaMRConfig(
        backbone=backbone,
        rubrics=(SWE_PRUNER_RUBRIC,),
        head_hidden=hidden,
        depth_norm=False,  # SWE-Pruner fuses raw hidden states
        trainable_top_layers=0,
        backbone_dtype=backbone_dtype,
        threshold=0.5,
    )
    model = build_model(config, device, backbone_weights=False)
    _load_strict(model.backbone.model, _swe_pruner_backbone_state(tensors, model), file, "backbone")
    _load_strict(model.head, _swe_pruner_head_state(tensors), file, "head")
    # SWE-Pruner scores yes/no against the input embedding table (tied in Qwen3-Reranker).
    embeddings = model.backbone.model.get_input_embeddings().weight
    no_id, yes_id = _answer_ids(model)
    model.backbone.answer_vectors = embeddings[[no_id, yes_id]].detach().clone()
    return model.eval()


def _answer_ids(model: LaMRModel) -> tuple[int, int]:
    return answer_token_ids(model.tokenizer)


def _swe_pruner_file(weights: str | Path) -> Path:
    path = Path(weights).expanduser()
    if path.is_dir():
        path = path / "model.safetensors"
    if path.is_file():
        return path
    if str(weights) != SWE_PRUNER_HUB_ID and (path.suffix or str(weights).startswith((".", "/", "~"))):
        raise VkvError(f"SWE-Pruner weights {path} do not exist")
    try:
        return Path(hf_hub_download(str(weights), "model.safetensors"))
    except Exception as exc:  # network, auth or missing repo: all end the same way for the user
        raise VkvError(
            f"could not fetch model.safetensors from the hub repo '{weights}': {str(exc).splitlines()[0]}"
        ) from exc


def _swe_pruner_backbone_state(tensors: dict[str, torch.Tensor], model: LaMRModel) -> dict[str, torch.Tensor]:
    state = {k[len("backbone.") :]: v for k, v in tensors.items() if k.startswith("backbone.")}
    expected = set(model.backbone.model.state_dict())
    embed_key = next((k for k in expected if k.endswith("embed_tokens.weight")), None)
    if embed_key and embed_key not in state:
        # safetensors drops one of two tensors sharing storage; SWE-Pruner also exposes the table as these
        for alias in ("embedding_layer.weight", "word_embeddings"):
            if alias in tensors:
                state[embed_key] = tensors[alias]
                break
    return state


def _swe_pruner_head_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    rubric = SWE_PRUNER_RUBRIC
    renames = {
        "fusion_layers.0.in_proj_weight": "fusion.attention.in_proj_weight",
        "fusion_layers.0.in_proj_bias": "fusion.attention.in_proj_bias",
        "fusion_layers.0.out_proj.weight": "fusion.attention.out_proj.weight",
        "fusion_layers.0.out_proj.bias": "fusion.attention.out_proj.bias",
        "fusion_norms.0.weight": "fusion.norm.weight",
        "fusion_norms.0.bias": "fusion.norm.bias",
        "compression_head.crf.start_transitions": f"crfs.{rubric}.start",
        "compression_head.crf.end_transitions": f"crfs.{rubric}.end",
    }
    for index in (0, 1, 4):
        for kind in ("weight", "bias"):
            renames[f"compression_head.feature_extractor.{index}.{kind}"] = f"heads.{rubric}.{index}.{kind}"
    missing = [k for k in list(renames) + ["compression_head.crf.transitions"] if k not in tensors]
    if missing:
        raise VkvError(f"SWE-Pruner checkpoint lacks {', '.join(missing[:4])}")
    state = {new: tensors[old] for old, new in renames.items()}
    state[f"crfs.{rubric}.transitions"] = tensors[
        "compression_head.crf.transitions"
    ].T.contiguous()  # [to,from]→[from,to]
    return state


def _load_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path, part: str) -> None:
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        detail = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise VkvError(f"{source}: the {part} weights do not match this configuration ({detail})")
    for key, value in state.items():
        if expected[key].shape != value.shape:
            raise VkvError(
                f"{source}: {part} tensor {key} has shape {tuple(value.shape)}, expected {tuple(expected[key].shape)}"
            )
    module.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()}, strict=True)


def _load_partial(module: torch.nn.Module, state: dict[str, torch.Tensor], source: Path) -> None:
    expected = module.state_dict()
    unknown = sorted(set(state) - set(expected))
    if unknown:
        raise VkvError(f"{source}: backbone tensors {unknown[:3]} do not exist in this backbone")
    with torch.no_grad():
        for key, value in state.items():
            if expected[key].shape != value.shape:
                raise VkvError(
                    f"{source}: backbone tensor {key} has shape {tuple(value.shape)}, expected {tuple(expected[key].shape)}"
                )
            expected[key].copy_(value.to(expected[key].dtype))
