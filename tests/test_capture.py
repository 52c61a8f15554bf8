import pytest
import torch

from vkv.errors import VkvError
from vkv.lm.capture import capture_span, projection_hooks

TEXT = "The project hashes passwords with bcryptjs and tests run with node:test; the JWT secret is dev-secret."


def manual_projections(lm, ids, start, end):
    """Recompute V and pre-RoPE K from the hidden states entering each layer."""
    out = lm.model(input_ids=ids.unsqueeze(0), output_hidden_states=True)
    values, keys = [], []
    for layer, hidden in zip(lm.model.model.layers, out.hidden_states[:-1]):
        normed = layer.input_layernorm(hidden)[0, start:end]
        shape = (end - start, -1, lm.spec.head_dim)
        values.append(layer.self_attn.v_proj(normed).reshape(shape).transpose(0, 1))
        keys.append(layer.self_attn.k_proj(normed).reshape(shape).transpose(0, 1))
    return torch.stack(values), torch.stack(keys), out.logits[0]


@pytest.mark.parametrize("start,end", [(0, 9), (4, 17)])
def test_capture_equals_manual_recomputation(tiny, start, end):
    ids = torch.tensor(tiny.tokenizer(TEXT)["input_ids"])
    acts, _ = capture_span(tiny, ids, start, end)
    with torch.no_grad():
        values, keys, logits = manual_projections(tiny, ids, start, end)
    assert acts.values.shape == (tiny.spec.num_layers, tiny.spec.num_kv_heads, end - start, tiny.spec.head_dim)
    torch.testing.assert_close(acts.values, values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(acts.keys_pre_rope, keys, atol=1e-5, rtol=1e-5)
    logp = torch.log_softmax(logits, -1)
    expected = torch.tensor([float("nan") if t == 0 else -logp[t - 1, ids[t]].item() for t in range(start, end)])
    torch.testing.assert_close(acts.surprisal, expected, atol=1e-4, rtol=1e-4, equal_nan=True)


def test_cache_holds_rotated_captured_keys_and_values(tiny):
    ids = torch.tensor(tiny.tokenizer(TEXT)["input_ids"])
    acts, cache = capture_span(tiny, ids, 3, 12, keep_cache=True)
    for layer in range(tiny.spec.num_layers):
        torch.testing.assert_close(cache.layers[layer].values[0, :, 3:12], acts.values[layer])
        rotated = tiny.rotate(acts.keys_pre_rope[layer], torch.arange(3, 12))
        torch.testing.assert_close(cache.layers[layer].keys[0, :, 3:12], rotated, atol=1e-5, rtol=1e-5)


def test_hooks_are_removed_and_change_nothing(tiny):
    ids = torch.tensor([tiny.tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        before = tiny.model(input_ids=ids).logits
        with projection_hooks(tiny, 0, 5):
            during = tiny.model(input_ids=ids).logits
    assert torch.equal(before, during)
    with pytest.raises(RuntimeError), projection_hooks(tiny, 0, 5):
        raise RuntimeError("boom")
    for attn in tiny.attention_modules():
        assert not attn.v_proj._forward_hooks and not attn.k_proj._forward_hooks


def test_empty_or_out_of_range_span_is_refused(tiny):
    with pytest.raises(VkvError, match="empty or outside"):
        capture_span(tiny, [1, 2, 3], 2, 2)
    with pytest.raises(VkvError, match="empty or outside"):
        capture_span(tiny, [1, 2, 3], 1, 9)


@pytest.mark.integration
def test_capture_on_test_model_in_8bit_matches_cache(smol8):
    ids = torch.tensor(smol8.tokenizer(TEXT)["input_ids"])
    acts, cache = capture_span(smol8, ids, 2, 10, keep_cache=True)
    torch.testing.assert_close(cache.layers[7].values[0, :, 2:10].float(), acts.values[7])
    assert torch.isfinite(acts.surprisal).all()
