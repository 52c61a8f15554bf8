"""Attention biases in the cache: per layer and KV head, added to later queries' logits for each entry.

Proportional attention is the shared special case: a virtual token standing for s tokens carries log(s).
"""

import json

import pytest
import torch

from tests.conftest import FIXTURES, shared_mass
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.span import compress_span
from vkv.errors import VkvError
from vkv.kv.file import save_cache
from vkv.kv.prefix import KVPrefix
from vkv.kv.segment import Segment, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.capture import capture_span
from vkv.lm.context import Context
from vkv.lm.rebuild import load_cache
from vkv.text.transcript import load_transcript, render


def _rendered(lm):
    return render(load_transcript(FIXTURES / "mini-agent.json"), lm.tokenizer)


def _prefix(lm, n=30):
    ids = _rendered(lm).ids[: n + 10]
    _, cache = capture_span(lm, ids, 0, n, keep_cache=True)
    return ids, KVPrefix.from_cache(cache)


def _with_bias(segment, bias):
    return Segment(segment.kind, segment.span, segment.keys, segment.values, segment.positions, bias=bias)


def _feed(lm, segment, probe):
    spliced = SplicedCache()
    spliced.append(segment)
    return Context(lm, spliced).feed(probe)


def test_a_bias_of_zeros_changes_nothing(tiny_llama):
    ids, prefix = _prefix(tiny_llama)
    seg = verbatim_segment(prefix.slice(0, 30), 0)
    zeros = _with_bias(seg, torch.zeros(seg.keys.shape[:3]))
    torch.testing.assert_close(_feed(tiny_llama, seg, ids[30:40]), _feed(tiny_llama, zeros, ids[30:40]))


@pytest.mark.parametrize("where", ["every head", "one layer and head"])
def test_an_entry_duplicated_equals_one_entry_with_bias_log_2(tiny_llama, where):
    """Duplicating entry 29 doubles the attention it draws; a bias of log 2 does the same. For one layer and KV
    head only, the duplicate is hidden from every other layer and head by a large negative bias."""
    ids, prefix = _prefix(tiny_llama)
    seg = verbatim_segment(prefix.slice(0, 30), 0)
    layers, heads = seg.keys.shape[:2]
    doubled = torch.cat([torch.arange(30), torch.tensor([29])])
    twice_bias = torch.zeros(layers, heads, 31)
    weighted_bias = torch.zeros(layers, heads, 30)
    if where == "every head":
        weighted_bias[:, :, 29] = torch.log(torch.tensor(2.0))
    else:
        layer, head = layers - 1, heads - 1
        twice_bias[:, :, 30] = -1e4
        twice_bias[layer, head, 30] = 0.0
        weighted_bias[layer, head, 29] = torch.log(torch.tensor(2.0))
    twice = Segment(
        "verbatim", (0, 30), seg.keys[:, :, doubled], seg.values[:, :, doubled], seg.positions[doubled], bias=twice_bias
    )
    weighted = _with_bias(seg, weighted_bias)
    torch.testing.assert_close(
        _feed(tiny_llama, twice, ids[30:40]), _feed(tiny_llama, weighted, ids[30:40]), atol=1e-5, rtol=1e-4
    )
    assert not torch.allclose(_feed(tiny_llama, seg, ids[30:40]), _feed(tiny_llama, weighted, ids[30:40]))


def test_the_direct_forward_and_the_models_own_honour_a_per_head_bias_alike(tiny_llama):
    """forward_kv attends to a biased prefix in vkv's kernel (fast) or through the model with hooks (slow)."""
    ids, prefix = _prefix(tiny_llama)
    torch.manual_seed(0)
    layers, heads = tiny_llama.spec.num_layers, tiny_llama.spec.num_kv_heads
    biased = KVPrefix(prefix.keys, prefix.values, None, [torch.randn(1, heads, 30) for _ in range(layers)])
    embeds = tiny_llama.embed(torch.tensor(ids[30:36]))[None]
    positions = torch.arange(30, 36).float()
    fast = tiny_llama.forward_kv(embeds, positions, biased, fast=True)
    slow = tiny_llama.forward_kv(embeds, positions, biased, fast=False)
    plain = tiny_llama.forward_kv(embeds, positions, prefix, fast=True)
    for a, b in zip(fast[1], slow[1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(fast[1][-1], plain[1][-1])  # the bias did change what later layers compute


def test_virtual_segment_bias_counts_its_blocks_and_survives_a_file(tiny_llama, tmp_path):
    rendered = _rendered(tiny_llama)
    start, end = rendered.spans[1].start, rendered.spans[3].start
    config = CompressConfig(proportional_attention=True, head_budget="shared", optim=OptimConfig(steps=1))
    spliced = compress_span(tiny_llama, rendered.ids, start, end, 3.0, config)
    virtual = spliced.segments[1]
    mass = shared_mass(virtual)
    assert int(mass.sum()) == end - start and mass.numel() == virtual.slots
    spliced.meta.update({"fingerprint": tiny_llama.fingerprint, "spec": tiny_llama.spec.to_dict()})
    save_cache(spliced, tmp_path / "c.safetensors")
    loaded = load_cache(tmp_path / "c.safetensors")
    torch.testing.assert_close(loaded.attention_bias(), spliced.attention_bias())
    assert spliced.attention_bias()[:, :, :start].abs().max() == 0
    off = compress_span(
        tiny_llama,
        rendered.ids,
        start,
        end,
        3.0,
        CompressConfig(proportional_attention=False, head_budget="shared", optim=OptimConfig(steps=1)),
    )
    assert off.segments[1].bias is None and off.attention_bias() is None


def test_a_version_1_file_with_mass_still_loads_as_a_shared_log_bias(tiny_llama, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    _, prefix = _prefix(tiny_llama)
    seg = verbatim_segment(prefix.slice(0, 30), 0)
    mass = torch.cat([torch.ones(29), torch.tensor([3.0])])
    spliced = SplicedCache(meta={"fingerprint": tiny_llama.fingerprint, "spec": tiny_llama.spec.to_dict()})
    spliced.append(_with_bias(seg, torch.zeros(seg.keys.shape[:3])))
    path = tmp_path / "v2.safetensors"
    save_cache(spliced, path)
    with safe_open(str(path), framework="pt") as f:  # rewrite it as version 1 wrote it: `mass`, no `bias`
        header = json.loads(f.metadata()["vkv"])
    tensors = load_file(str(path))
    tensors.pop("segments.0.bias")
    tensors["segments.0.mass"] = mass
    header["format_version"] = 1
    for name in ("digest", "key_id", "signature"):  # version 1 wrote none
        del header[name]
    save_file(tensors, str(tmp_path / "v1.safetensors"), metadata={"vkv": json.dumps(header)})
    loaded = load_cache(tmp_path / "v1.safetensors", tiny_llama, trust_foreign=True)  # unsigned: loaded when trusted
    assert torch.equal(shared_mass(loaded.segments[0]), mass)
    header["format_version"] = 99
    save_file(tensors, str(tmp_path / "v3.safetensors"), metadata={"vkv": json.dumps(header)})
    with pytest.raises(VkvError, match="format_version: cache format version 99"):
        load_cache(tmp_path / "v3.safetensors")


def test_fitted_biases_give_the_span_back_its_mass_and_survive_an_embeddings_file(tiny_llama, tmp_path):
    """fit_bias replaces log(block size) by per-layer, per-head biases fitted on the span's own queries: the
    virtual tokens then draw those queries' mass from the span better than the shared log(block size) does."""
    from vkv.compress.problem import SpanProblem

    rendered = _rendered(tiny_llama)
    start, end = rendered.spans[1].start, rendered.spans[3].start
    config = CompressConfig(fit_bias=True, head_budget="shared", optim=OptimConfig(steps=1)).validate()
    spliced = compress_span(tiny_llama, rendered.ids, start, end, 3.0, config)
    virtual = spliced.segments[1]
    acts, _ = capture_span(tiny_llama, rendered.ids[:end], start, end, queries=True)
    problem = SpanProblem.build(tiny_llama, rendered.ids, acts, virtual.slots, config)
    readout = problem.readout
    mass = problem.mass(config)
    layers, heads, k, dim = virtual.keys.shape

    def error(bias):
        scores = readout.queries @ virtual.keys.transpose(-1, -2) + bias[:, :, None, :]
        return (scores.logsumexp(-1) - readout.log_norm).exp().sub(1).pow(2).sum()

    shared = mass.float().log().expand(layers, heads, k)
    assert virtual.bias.shape == (layers, heads, k) and not torch.allclose(virtual.bias, shared)
    assert error(virtual.bias) < error(shared)
    spliced.meta.update({"fingerprint": tiny_llama.fingerprint, "spec": tiny_llama.spec.to_dict()})
    save_cache(spliced, tmp_path / "e.safetensors", store="embeddings", ids=rendered.ids)
    loaded = load_cache(tmp_path / "e.safetensors", tiny_llama)
    torch.testing.assert_close(loaded.attention_bias(), spliced.attention_bias())


def test_fit_bias_with_hybrid_is_refused_not_approximated(tiny_llama):
    from vkv.compress.problem import SpanProblem

    rendered = _rendered(tiny_llama)
    start, end = rendered.spans[1].start, rendered.spans[3].start
    acts, _ = capture_span(tiny_llama, rendered.ids[:end], start, end)
    config = CompressConfig(fit_bias=True).validate()
    with pytest.raises(VkvError, match="fit_bias is not implemented"):
        SpanProblem.build(tiny_llama, rendered.ids, acts, 4, config, tokens=torch.arange(0, end - start, 2))
