"""LaMR on a tiny random Llama backbone with the real SmolLM2 tokenizer: layers, gate, training, pruning."""

import ast
from pathlib import Path

import pytest
import torch

from vkv.backends.lamr import LaMR, LaMRConfig, Record, TrainConfig, build_model, fit, load_checkpoint, save_checkpoint
from vkv.backends.lamr.dataset import encode
from vkv.backends.lamr.evaluate import evaluate
from vkv.backends.lamr.model import gate_balance_loss, normalise_depths
from vkv.backends.lamr.train import forward, loss_terms, make_batch

TOKENIZER = Path.home() / ".cache" / "vkv" / "models" / "smollm2-135m"
pytestmark = pytest.mark.skipif(
    not (TOKENIZER / "tokenizer.json").is_file(), reason="smollm2-135m tokenizer not fetched"
)

CODE = '''import os
import sys

LIMIT = 3


def helper(path):
    return os.path.basename(path)


def target(paths):
    """Names of the first few paths."""
    names = []
    for path in paths[:LIMIT]:
        names.append(helper(path))
    return names


def unrelated(x):
    if x:
        return sys.argv
    return None
'''


@pytest.fixture(scope="module")
def tiny_backbone(tmp_path_factory) -> str:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def records() -> list[Record]:
    target_lines = tuple(range(11, 18))  # 1-based: the `target` function
    return [
        Record("How does `target` work?", CODE, target_lines, 1.0),
        Record("What does `unrelated` return?", CODE, tuple(range(20, 24)), 1.0),
        Record("Where is `frobnicate` defined?", CODE, (), 0.0),
    ]


def test_top_layers_are_really_trainable(tiny_backbone):
    model = build_model(LaMRConfig(backbone=tiny_backbone, trainable_top_layers=2))
    layers = model.backbone.decoder_layers()
    top = {id(p) for layer in list(layers)[-2:] for p in layer.parameters()}
    for name, parameter in model.backbone.model.named_parameters():
        assert parameter.requires_grad == (id(parameter) in top), name
    assert all(p.requires_grad for p in model.head.parameters())
    frozen = build_model(LaMRConfig(backbone=tiny_backbone, trainable_top_layers=0))
    assert frozen.backbone_frozen and not any(p.requires_grad for p in frozen.backbone.parameters())


def test_gate_is_a_distribution_and_balance_loss_bounds():
    gate = torch.softmax(torch.randn(2, 5, 2), dim=-1)
    mask = torch.ones(2, 5, dtype=torch.bool)
    assert 0.0 <= float(gate_balance_loss(gate, mask)) <= float(torch.log(torch.tensor(2.0))) + 1e-6
    collapsed = torch.zeros(2, 5, 2)
    collapsed[..., 0] = 1.0
    assert float(gate_balance_loss(collapsed, mask)) == pytest.approx(float(torch.log(torch.tensor(2.0))), abs=1e-5)
    balanced = torch.full((2, 5, 2), 0.5)
    assert float(gate_balance_loss(balanced, mask)) == pytest.approx(0.0, abs=1e-6)


def test_depth_normalisation_tames_massive_activations():
    features = torch.randn(2, 5, 3 * 8)
    features[0, 0, 8 + 3] = 2.5e4  # one massive activation in the middle depth
    normalised = normalise_depths(features, 3).reshape(2, 5, 3, 8)
    assert torch.allclose(normalised.pow(2).mean(-1), torch.ones(2, 5, 3), atol=1e-4)
    assert torch.allclose(normalised[1], normalise_depths(features[1:], 3).reshape(5, 3, 8))


def test_forward_shapes_gate_and_one_rubric(tiny_backbone):
    model = build_model(LaMRConfig(backbone=tiny_backbone, trainable_top_layers=1))
    encoded = encode(model.tokenizer, records(), model.config)
    batch = make_batch(encoded.examples, 0, model.device)
    out = forward(model, batch)
    b, t = batch.attention.shape
    assert out.head.rubric_emissions.shape == (b, t, 2, 2)
    assert torch.allclose(out.head.gate.sum(-1), torch.ones(b, t), atol=1e-5)
    fused = (out.head.gate.unsqueeze(-1) * out.head.rubric_emissions).sum(2)
    assert torch.allclose(out.head.fused, fused, atol=1e-6)
    terms = loss_terms(model, out, batch, TrainConfig())
    terms["total"].backward()
    top = model.backbone.decoder_layers()[-1]
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in top.parameters())
    single = build_model(LaMRConfig(backbone=tiny_backbone, rubrics=("semantic",), trainable_top_layers=0))
    assert single.head.gate is None and single.head.final_crf is None
    assert single.head.decision_crf is single.head.crfs["semantic"]


def test_train_step_checkpoint_and_prune(tiny_backbone, tmp_path):
    torch.manual_seed(0)
    config = LaMRConfig(backbone=tiny_backbone, trainable_top_layers=0, max_length=160, chunk_overlap=8)
    model = build_model(config)
    train_set = encode(model.tokenizer, records(), config)
    assert len(train_set.examples) > len(records())  # long code was chunked with overlap
    before = {k: v.clone() for k, v in model.head.state_dict().items()}
    summary = fit(
        model,
        train_set,
        train_set,
        TrainConfig(epochs=2, batch_size=2, lr=1e-3),
        log=lambda _: None,
        show_progress=False,
    )
    assert summary.steps == 2 * 3 and train_set.cached
    assert "f1" in summary.best_val and summary.history[0]["loss_total"] > 0
    assert any(not torch.equal(before[k], v) for k, v in model.head.state_dict().items())
    result = evaluate(model, train_set)
    assert set(result.scores) == {"teacher", "denoised"} and result.python_parse_rate == 1.0

    save_checkpoint(model, tmp_path / "ckpt", {"note": "test"})
    loaded, manifest = load_checkpoint(tmp_path / "ckpt")
    assert manifest["note"] == "test"
    for key, value in model.head.state_dict().items():
        assert torch.equal(value, loaded.head.state_dict()[key]), key
    pruner = LaMR(loaded, threshold=0.4)
    pruned = pruner.prune(CODE, "How does `target` work?")
    ast.parse(pruned.text)
    assert pruned.compressed_tokens == pruner.count_tokens(pruned.text)
    budgeted = pruner.prune(CODE, "How does `target` work?", ratio=3.0)
    ast.parse(budgeted.text)
    assert budgeted.compressed_tokens <= budgeted.original_tokens / 3.0 or budgeted.report["over_budget"]


def test_checkpoint_with_trained_layers_round_trips(tiny_backbone, tmp_path):
    model = build_model(LaMRConfig(backbone=tiny_backbone, trainable_top_layers=1))
    top = model.backbone.decoder_layers()[-1]
    with torch.no_grad():
        for p in top.parameters():
            p.add_(0.5)
    save_checkpoint(model, tmp_path / "c")
    loaded, _ = load_checkpoint(tmp_path / "c")
    for (name, a), b in zip(top.named_parameters(), loaded.backbone.decoder_layers()[-1].parameters()):
        assert torch.equal(a, b), name
