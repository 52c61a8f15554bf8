"""SWE-Pruner's published key layout loads into one-rubric LaMR and computes what SWE-Pruner computes."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from vkv.backends.lamr import load_swe_pruner
from vkv.backends.lamr.crf import LinearChainCRF
from vkv.errors import VkvError

TOKENIZER = Path.home() / ".cache" / "vkv" / "models" / "smollm2-135m"
pytestmark = pytest.mark.skipif(
    not (TOKENIZER / "tokenizer.json").is_file(), reason="smollm2-135m tokenizer not fetched"
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    torch.manual_seed(1)
    model = LlamaForCausalLM(config).eval()
    directory = tmp_path_factory.mktemp("tiny-swe-backbone")
    model.save_pretrained(directory)  # only its config and tokenizer are read by the loader
    tokenizer.save_pretrained(directory)
    return str(directory), model, tokenizer


def swe_pruner_tensors(base: nn.Module, width: int, hidden: int = 256) -> dict[str, torch.Tensor]:
    """A random checkpoint in SWE-Pruner's layout (AutoModel backbone + fusion + single head + CRF)."""
    g = torch.Generator().manual_seed(5)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    tensors = {f"backbone.{k}": v.clone() for k, v in base.state_dict().items()}
    tensors.update(
        {
            "fusion_layers.0.in_proj_weight": rand(3 * width, width),
            "fusion_layers.0.in_proj_bias": rand(3 * width),
            "fusion_layers.0.out_proj.weight": rand(width, width),
            "fusion_layers.0.out_proj.bias": rand(width),
            "fusion_norms.0.weight": 1 + rand(width),
            "fusion_norms.0.bias": rand(width),
            "compression_head.feature_extractor.0.weight": 1 + rand(width),
            "compression_head.feature_extractor.0.bias": rand(width),
            "compression_head.feature_extractor.1.weight": rand(hidden, width),
            "compression_head.feature_extractor.1.bias": rand(hidden),
            "compression_head.feature_extractor.4.weight": rand(2, hidden),
            "compression_head.feature_extractor.4.bias": rand(2),
            "compression_head.crf.transitions": torch.tensor([[0.3, -1.2], [2.0, 0.1]]),  # [to, from]
            "compression_head.crf.start_transitions": torch.tensor([0.2, -0.4]),
            "compression_head.crf.end_transitions": torch.tensor([-0.1, 0.5]),
        }
    )
    return tensors


def reference_emissions(tensors, base, ids):
    """SWE-Pruner's forward, rebuilt from the raw tensors with plain torch modules."""
    out = base(input_ids=ids, output_hidden_states=True)
    layers = base.config.num_hidden_layers
    picks = [max(1, int(layers * 0.25)), max(1, int(layers * 0.5)), layers]
    h = torch.cat([out.hidden_states[i] for i in picks], dim=-1)
    width = h.shape[-1]
    attention = nn.MultiheadAttention(width, 8, batch_first=True)
    attention.load_state_dict(
        {
            "in_proj_weight": tensors["fusion_layers.0.in_proj_weight"],
            "in_proj_bias": tensors["fusion_layers.0.in_proj_bias"],
            "out_proj.weight": tensors["fusion_layers.0.out_proj.weight"],
            "out_proj.bias": tensors["fusion_layers.0.out_proj.bias"],
        }
    )
    norm = nn.LayerNorm(width)
    norm.load_state_dict({"weight": tensors["fusion_norms.0.weight"], "bias": tensors["fusion_norms.0.bias"]})
    h = norm(attention(h, h, h, need_weights=False)[0] + h)
    head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 256), nn.GELU(), nn.Dropout(0.0), nn.Linear(256, 2))
    head.load_state_dict(
        {
            k.removeprefix("compression_head.feature_extractor."): v
            for k, v in tensors.items()
            if k.startswith("compression_head.feature_extractor.")
        }
    )
    emissions = head(h)
    last = out.last_hidden_state[:, -1]
    embed = tensors["backbone.embed_tokens.weight"]
    return emissions, last, embed


def swe_pruner_path_score(tensors, emissions, tags):
    """Their convention: transitions indexed [current, previous]."""
    trans = tensors["compression_head.crf.transitions"]
    score = tensors["compression_head.crf.start_transitions"][tags[0]] + emissions[0, tags[0]]
    for t in range(1, len(tags)):
        score = score + emissions[t, tags[t]] + trans[tags[t], tags[t - 1]]
    return score + tensors["compression_head.crf.end_transitions"][tags[-1]]


@torch.no_grad()
def test_swe_pruner_layout_loads_into_one_rubric(tiny, tmp_path):
    directory, causal, tokenizer = tiny
    base = causal.base_model
    width = 64 * 3
    tensors = swe_pruner_tensors(base, width)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = load_swe_pruner(tmp_path, backbone=directory)
    assert model.config.rubrics == ("semantic",) and model.head.gate is None
    for key in base.state_dict():
        assert torch.equal(model.backbone.model.state_dict()[key], tensors[f"backbone.{key}"]), key

    ids = torch.tensor([tokenizer("def f(x):\n    return x + 1\n", add_special_tokens=False)["input_ids"]])
    output = model(ids, torch.ones_like(ids))
    emissions, last, embed = reference_emissions(tensors, model.backbone.model, ids)
    assert torch.allclose(output.head.fused, emissions, atol=1e-5)

    no_id, yes_id = tokenizer.convert_tokens_to_ids("no"), tokenizer.convert_tokens_to_ids("yes")
    logits = last @ embed[[no_id, yes_id]].T
    assert torch.allclose(output.relevance, torch.softmax(logits, -1)[:, 1], atol=1e-5)

    crf: LinearChainCRF = model.head.decision_crf
    tags = torch.tensor([[0, 1, 1, 0, 1]])
    e = emissions[:, :5]
    ours = crf.path_score(e, tags, torch.ones_like(tags, dtype=torch.bool))
    assert float(ours[0]) == pytest.approx(float(swe_pruner_path_score(tensors, e[0], tags[0])), abs=1e-5)


def test_swe_pruner_weights_prune_through_the_seam(tiny, tmp_path):
    import ast

    from vkv.backends.lamr import LaMR

    directory, causal, _ = tiny
    save_file(swe_pruner_tensors(causal.base_model, 64 * 3), str(tmp_path / "model.safetensors"))
    pruner = LaMR.from_checkpoint(tmp_path, backbone=directory)
    assert pruner.threshold == 0.5 and pruner.model.config.depth_norm is False
    result = pruner.prune("import os\n\n\ndef f(p):\n    return os.path.basename(p)\n", "what does f return?")
    ast.parse(result.text)


@torch.no_grad()
def test_shared_embedding_alias_and_wrong_layout(tiny, tmp_path):
    directory, causal, _ = tiny
    tensors = swe_pruner_tensors(causal.base_model, 64 * 3)
    tensors["embedding_layer.weight"] = tensors.pop("backbone.embed_tokens.weight")  # deduplicated on save
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = load_swe_pruner(tmp_path / "model.safetensors", backbone=directory)
    assert torch.equal(model.backbone.model.embed_tokens.weight, tensors["embedding_layer.weight"])

    save_file({"something.else": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(VkvError, match="key layout"):
        load_swe_pruner(tmp_path / "other.safetensors", backbone=directory)
    with pytest.raises(VkvError, match="do not exist"):
        load_swe_pruner(tmp_path / "missing.safetensors", backbone=directory)
