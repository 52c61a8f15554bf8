import pytest
import torch

from tests.conftest import build_tiny
from vkv.errors import VkvError
from vkv.lm.load import load_model, resolve_quant
from vkv.lm.spec import fingerprint
from vkv.tools.doctor import check


def test_tiny_models_are_frozen_and_described(tiny):
    assert not tiny.model.training
    assert all(not p.requires_grad for p in tiny.model.parameters())
    assert tiny.spec.num_layers == 3 and tiny.spec.num_kv_heads == 2 and tiny.spec.head_dim == 16
    assert len(tiny.attention_modules()) == 3


def test_fingerprint_is_stable_and_sensitive(smol_tokenizer):
    a = build_tiny("llama", smol_tokenizer, seed=0)
    b = build_tiny("llama", smol_tokenizer, seed=1)  # other weights, same architecture and tokenizer
    c = build_tiny("llama", smol_tokenizer, layers=4)
    assert a.fingerprint == b.fingerprint
    assert a.fingerprint != c.fingerprint
    assert fingerprint(a.config, smol_tokenizer) == a.fingerprint


def test_auto_quant_means_fp32_on_cpu_and_8bit_on_cuda():
    assert resolve_quant("auto", torch.device("cpu")) == "fp32"
    assert resolve_quant("auto", torch.device("cuda")) == "8bit"
    with pytest.raises(VkvError, match="unknown quantisation"):
        resolve_quant("int3", torch.device("cpu"))


@pytest.mark.parametrize("name", ["./no/such/dir", "/definitely/missing", "not-a-real-org/not-a-real-model-xyz"])
def test_unknown_model_is_one_clear_error(name, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(VkvError, match="model"):
        load_model(name, quant="fp32", device="cpu")


def test_doctor_on_tiny_model_sees_gradients(tiny):
    report = check(tiny)
    assert report["ok"] and report["grad_norm"] > 0 and report["trainable_parameters"] == 0


def test_rotate_then_unrotate_is_identity(tiny):
    keys = torch.randn(2, 5, tiny.spec.head_dim)
    positions = torch.tensor([0.0, 3.5, 7.25, 100.0, 4000.0])
    back = tiny.rotate(tiny.rotate(keys, positions), positions, inverse=True)
    assert torch.allclose(back, keys, atol=1e-5)


@pytest.mark.integration
@pytest.mark.parametrize("quant", ["fp32", "8bit"])
def test_doctor_on_test_model(quant, smol, smol8):
    lm = smol if quant == "fp32" else smol8
    report = check(lm)
    assert report["ok"], report
    assert report["num_layers"] == 30 and report["num_kv_heads"] == 3 and report["head_dim"] == 64
    if quant == "8bit":
        import bitsandbytes as bnb

        assert isinstance(lm.attention_modules()[0].v_proj, bnb.nn.Linear8bitLt)
    assert smol.fingerprint == smol8.fingerprint


def test_hub_ids_with_dots_are_hub_ids_and_paths_are_not():
    from vkv.errors import VkvError
    from vkv.lm.load import resolve_model_path

    assert resolve_model_path("Qwen/Qwen2.5-Coder-7B-Instruct") == ("Qwen/Qwen2.5-Coder-7B-Instruct", False)
    with pytest.raises(VkvError, match="unknown model 'smollm2-135'.*hub ids are owner/name"):
        resolve_model_path("smollm2-135")  # a bare name neither an alias nor downloaded: a misspelled alias
    for bad in ("./missing-dir", "/no/such/model", "~/x", "a/b/c", "cache.safetensors/"):
        with pytest.raises(VkvError, match="unknown model"):
            resolve_model_path(bad)
