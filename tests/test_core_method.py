"""The spliced cache and optimiser against independent references (tiny models: seconds)."""

import math

import pytest
import torch

from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.span import compress_span
from vkv.errors import VkvError
from vkv.kv.file import _pack_bits, _unpack_bits, cache_metadata, save_cache
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.capture import capture_span
from vkv.lm.context import Context
from vkv.lm.rebuild import load_cache

TEXT = (
    "The project hashes passwords with bcryptjs. Tests use the built-in node:test runner. "
    "The default JWT secret is dev-secret and finished tasks have the status done."
)


def ids_of(lm, text=TEXT):
    return lm.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_recorded_kv_equals_the_models_own_cache(tiny):
    ids = ids_of(tiny)
    _, cache = capture_span(tiny, ids, 0, len(ids), keep_cache=True)
    prefix = KVPrefix.from_cache(cache, 6)
    keys, values = tiny.forward_kv(tiny.embed(torch.tensor([ids[6:]])), torch.arange(6, len(ids)), prefix)
    for layer in range(tiny.spec.num_layers):
        torch.testing.assert_close(keys[layer], cache.layers[layer].keys[:, :, 6:], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(values[layer], cache.layers[layer].values[:, :, 6:], atol=1e-5, rtol=1e-5)
    assert cache.layers[0].keys.shape[2] == len(ids)  # the prefix was read, never mutated


def test_forward_kv_stops_before_the_last_layers_mlp(tiny_llama):
    calls = []
    handle = tiny_llama.model.model.layers[-1].mlp.register_forward_hook(lambda *a: calls.append(1))
    try:
        tiny_llama.forward_kv(tiny_llama.embed(torch.tensor([[5, 6, 7]])), torch.arange(3.0), KVPrefix([], []))
    finally:
        handle.remove()
    assert calls == []


def test_fractional_position_is_the_closed_form_rotation(tiny_llama):
    lm = tiny_llama
    embed = lm.embed(torch.tensor([[42]]))
    keys, _ = lm.forward_kv(embed, torch.tensor([7.5]), KVPrefix([], []))
    layer = lm.model.model.layers[0]
    with torch.no_grad():
        k = layer.self_attn.k_proj(layer.input_layernorm(embed))[0, 0].reshape(-1, lm.spec.head_dim)
    d = lm.spec.head_dim
    inv_freq = 1.0 / (lm.spec.rope_theta ** (torch.arange(0, d, 2).float() / d))
    angle = 7.5 * inv_freq
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = k[:, : d // 2], k[:, d // 2 :]
    expected = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    torch.testing.assert_close(keys[0][0, :, 0], expected, atol=1e-5, rtol=1e-5)


def full_logits(lm, ids, mask=None):
    with torch.no_grad():
        return lm.model(input_ids=torch.tensor([ids]), attention_mask=mask).logits[0].float()


def test_all_verbatim_splice_reproduces_full_context(tiny):
    ids = ids_of(tiny)
    cut = 11
    _, cache = capture_span(tiny, ids, 0, cut, keep_cache=True)
    spliced = SplicedCache()
    kv = KVPrefix.from_cache(cache)
    spliced.append(verbatim_segment(kv.slice(0, 5), 0))
    spliced.append(verbatim_segment(kv.slice(5, cut), 5))
    logits = Context(tiny, spliced).feed(ids[cut:])
    torch.testing.assert_close(logits, full_logits(tiny, ids)[cut:], atol=1e-4, rtol=1e-4)


def test_removed_span_equals_masked_attention_reference(tiny):
    ids = ids_of(tiny)
    a, b = 4, 12
    _, cache = capture_span(tiny, ids, 0, a, keep_cache=True)
    spliced = SplicedCache()
    spliced.append(verbatim_segment(KVPrefix.from_cache(cache), 0), next_position=b)  # span removed, positions kept
    logits = Context(tiny, spliced).feed(ids[b:])
    n = len(ids)
    allowed = torch.ones(n, n).tril().bool()
    allowed[b:, a:b] = False  # later tokens cannot see the removed span
    mask = torch.zeros(n, n).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    torch.testing.assert_close(logits, full_logits(tiny, ids, mask)[b:], atol=1e-4, rtol=1e-4)


def test_save_load_roundtrip_gives_identical_logits(tiny_llama, tmp_path):
    lm = tiny_llama
    ids = ids_of(lm)
    spliced = compress_span(lm, ids, 3, 20, 3.0, CompressConfig(optim=OptimConfig(steps=3)))
    spliced.meta = cache_metadata(lm)
    path = tmp_path / "c.safetensors"
    save_cache(spliced, path)
    loaded = load_cache(path, lm)
    assert [s.kind for s in loaded.segments] == ["verbatim", "compact", "verbatim"]  # the default recipe
    assert loaded.next_position == len(ids)
    q = ids_of(lm, " Which runner?")
    torch.testing.assert_close(Context(lm, loaded).feed(q), Context(lm, spliced).feed(q), atol=0, rtol=0)


def test_bit_masks_pack_eight_to_a_byte_and_back():
    g = torch.Generator().manual_seed(0)
    for shape in ((1,), (3, 5), (2, 3, 8), (30, 3, 447)):
        mask = torch.rand(shape, generator=g) > 0.5
        packed = _pack_bits(mask)
        assert packed.dtype == torch.uint8 and packed.shape == (-(-mask.numel() // 8),)
        assert torch.equal(_unpack_bits(packed, shape), mask)
    assert _pack_bits(torch.tensor([True, *[False] * 6, True, False, True])).tolist() == [129, 64]


def test_cache_files_refuse_mismatch_and_corruption(tiny_llama, smol_tokenizer, tmp_path):
    from tests.conftest import build_tiny

    lm = tiny_llama
    spliced = compress_span(lm, ids_of(lm), 2, 12, 2.0, CompressConfig(optim=OptimConfig(steps=1)))
    spliced.meta = cache_metadata(lm)
    path = tmp_path / "c.safetensors"
    save_cache(spliced, path)
    other = build_tiny("llama", smol_tokenizer, layers=4)
    with pytest.raises(VkvError, match="field fingerprint: cache was built for model 'tiny-llama'"):
        load_cache(path, other)
    truncated = tmp_path / "t.safetensors"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(VkvError, match="truncated or corrupt"):
        load_cache(truncated, lm)
    garbage = tmp_path / "g.safetensors"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(VkvError, match="t.safetensors|g.safetensors"):
        load_cache(garbage, lm)


def test_bad_ratio_and_empty_span_are_clear_errors(tiny_llama):
    ids = ids_of(tiny_llama)
    with pytest.raises(VkvError, match="compression ratio must be at least 1"):
        compress_span(tiny_llama, ids, 2, 12, 0.9, CompressConfig(optim=OptimConfig(steps=1)))
    with pytest.raises(VkvError, match="empty"):
        compress_span(tiny_llama, ids, 5, 5, 2.0, CompressConfig(optim=OptimConfig(steps=1)))


def test_optimiser_keeps_best_and_is_deterministic(tiny_llama):
    ids = ids_of(tiny_llama)
    cfg = CompressConfig(verbatim_share=0.0, optim=OptimConfig(steps=15, lr=5e-2, init="random", seed=3))
    first = compress_span(tiny_llama, ids, 2, 30, 4.0, cfg).segments[1]
    second = compress_span(tiny_llama, ids, 2, 30, 4.0, cfg).segments[1]
    assert torch.equal(first.embeddings, second.embeddings)
    st = first.stats
    assert st["best_loss"] == min(st["trace"]) and st["best_loss"] < st["initial_loss"]
    assert len(st["per_layer_loss"]) == tiny_llama.spec.num_layers


@pytest.mark.parametrize("target", ["kv-pre-rope", "kv-post-rope"])
@pytest.mark.parametrize("loss", ["mse", "cosine"])
def test_key_targets_and_losses_optimise(tiny_llama, target, loss):
    ids = ids_of(tiny_llama)
    cfg = CompressConfig(target=target, optim=OptimConfig(steps=8, loss=loss))
    seg = compress_span(tiny_llama, ids, 2, 20, 3.0, cfg).segments[1]
    assert math.isfinite(seg.stats["best_loss"]) and seg.stats["best_loss"] <= seg.stats["initial_loss"]
