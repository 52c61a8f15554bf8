"""The ragged decoding cache: the same numbers as the padded layout with biases, in the memory of the real entries.

The reference here is the layout caches had before: every head padded to the same length in a DynamicCache, with the
per-layer, per-KV-head biases added to the attention mask by hooks and new tokens moved to the logical positions by a
hook on the rotary embedding. It lives only in this file.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from vkv.errors import VkvError
from vkv.kv.ragged import FlatHeads, RaggedCache, RaggedLayer
from vkv.kv.segment import MASKED, Segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.context import Context
from vkv.lm.generate import generate

# ---- the padded reference ----------------------------------------------------------------------------------------


@contextmanager
def padded_bias_hooks(lm, bias: torch.Tensor | None, offset: int):
    """Per layer, add `bias` `[layers, kv_heads, L]` to the first L columns of every query head's mask, and place new
    tokens `offset` positions later on the RoPE axis than their cache index."""
    handles = []
    group = lm.spec.num_heads // lm.spec.num_kv_heads

    def hook_for(layer):
        def add(_module, args, kwargs):
            mask = kwargs.get("attention_mask")
            new = kwargs["hidden_states"].shape[1]
            past = kwargs["cache"].get_seq_length(layer) if kwargs.get("cache") is not None else 0
            if mask is None:
                blocked = torch.ones(new, new, dtype=torch.bool).triu(1)
                mask = torch.zeros(new, past + new).masked_fill(
                    torch.cat([torch.zeros(new, past, dtype=torch.bool), blocked], 1), MASKED
                )[None, None]
            elif mask.dtype == torch.bool:
                mask = torch.zeros(mask.shape).masked_fill(~mask, MASKED)
            mask = mask.expand(-1, lm.spec.num_heads, -1, -1).clone()
            b = bias[layer].repeat_interleave(group, dim=0)[None, :, None, :]
            mask[..., : b.shape[-1]] += b
            return args, {**kwargs, "attention_mask": mask}

        return add

    if bias is not None:
        handles += [
            m.register_forward_pre_hook(hook_for(i), with_kwargs=True) for i, m in enumerate(lm.attention_modules())
        ]

    def shift(_module, args, kwargs):
        if "position_ids" in kwargs:
            return args, {**kwargs, "position_ids": kwargs["position_ids"] + offset}
        return (args[0], args[1] + offset, *args[2:]), kwargs

    if offset:
        handles.append(lm.model.model.rotary_emb.register_forward_pre_hook(shift, with_kwargs=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def padded_cache(lm, spliced: SplicedCache, batch: int = 1):
    from transformers import DynamicCache

    cache = DynamicCache(config=lm.model.config)
    for layer, (k, v) in enumerate(zip(*(spliced.kv().keys, spliced.kv().values))):
        cache.update(k.repeat(batch, 1, 1, 1), v.repeat(batch, 1, 1, 1), layer)
    return cache


def padded_logits(lm, spliced: SplicedCache, ids: list[int]) -> torch.Tensor:
    physical = spliced.physical_length
    with torch.no_grad(), padded_bias_hooks(lm, spliced.attention_bias(), 0):
        out = lm.model(
            input_ids=torch.tensor([ids]),
            position_ids=torch.arange(spliced.next_position, spliced.next_position + len(ids)).float()[None],
            cache=padded_cache(lm, spliced) if physical else None,
            use_cache=True,
        )
    return out.logits[0]


def padded_generate(lm, spliced: SplicedCache, prompt: list[int], **kwargs) -> torch.Tensor:
    physical = spliced.physical_length
    input_ids = torch.cat([torch.zeros(1, physical, dtype=torch.long), torch.tensor([prompt])], 1)
    cache = padded_cache(lm, spliced, kwargs.get("num_return_sequences", 1))
    with torch.no_grad(), padded_bias_hooks(lm, spliced.attention_bias(), spliced.next_position - physical):
        out = lm.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), cache=cache, **kwargs)
    return out[:, input_ids.shape[1] :]


# ---- caches of every kind of segment ------------------------------------------------------------------------------


def random_segment(lm, kind, span, entries, reach=None, biased=False, seed=0) -> Segment:
    """K/V from noise; `reach` `[layers, kv_heads, entries]` (bool) masks unreached slots with −inf biases."""
    g = torch.Generator().manual_seed(seed)
    layers, heads, dim = lm.cache_shape
    keys = torch.randn(layers, heads, entries, dim, generator=g)
    values = torch.randn(layers, heads, entries, dim, generator=g)
    bias = torch.randn(layers, heads, entries, generator=g) * 0.7 if biased or reach is not None else None
    if reach is not None:
        bias = bias.masked_fill(~reach, MASKED)
    positions = torch.linspace(span[0], span[1] - 1, entries)
    return Segment(kind, span, keys, values, positions, bias=bias)


def head_wise_reach(lm, entries: int, seed: int = 1) -> torch.Tensor:
    """A head-wise budget's reach with the hard cases: a head with no entry, a head with every entry."""
    layers, heads, _ = lm.cache_shape
    reach = torch.rand(layers, heads, entries, generator=torch.Generator().manual_seed(seed)) < 0.5
    reach[0, 0] = False  # a head that reaches nothing of this segment
    reach[-1, -1] = True  # a head that reaches every slot
    return reach


def caches(lm) -> dict[str, SplicedCache]:
    sys = random_segment(lm, "verbatim", (0, 12), 12, seed=1)
    verbatim_tail = random_segment(lm, "verbatim", (80, 86), 6, seed=9)
    return {
        "verbatim": SplicedCache([sys, random_segment(lm, "verbatim", (12, 40), 28, seed=2)], 40),
        "virtual": SplicedCache([sys, random_segment(lm, "virtual", (12, 80), 9, biased=True, seed=3)], 80),
        "compact": SplicedCache(
            [sys, random_segment(lm, "compact", (12, 80), 14, head_wise_reach(lm, 14), seed=4)], 80
        ),
        "head-wise virtual": SplicedCache(
            [sys, random_segment(lm, "virtual", (12, 80), 20, head_wise_reach(lm, 20, 5), seed=5)], 80
        ),
        "mixed": SplicedCache(
            [
                sys,
                random_segment(lm, "compact", (12, 40), 10, head_wise_reach(lm, 10, 6), seed=6),
                random_segment(lm, "virtual", (40, 60), 5, biased=True, seed=7),
                random_segment(lm, "virtual", (60, 80), 8, head_wise_reach(lm, 8, 8), seed=8),
                verbatim_tail,
            ],
            86,
        ),
        "compact without biases": SplicedCache(
            [sys, unbiased(random_segment(lm, "compact", (12, 80), 14, head_wise_reach(lm, 14, 11), seed=11))], 80
        ),
        "no prefix, only flat": SplicedCache(
            [random_segment(lm, "compact", (0, 40), 10, head_wise_reach(lm, 10, 10), seed=10)], 40
        ),
    }


CACHE_NAMES = [
    "verbatim",
    "virtual",
    "compact",
    "head-wise virtual",
    "mixed",
    "compact without biases",
    "no prefix, only flat",
]


def unbiased(segment: Segment) -> Segment:
    """kvzip's head-wise selection: reached entries carry no bias, unreached slots −inf."""
    segment.bias = torch.where(torch.isfinite(segment.bias), 0.0, MASKED)
    return segment


@pytest.mark.parametrize("name", CACHE_NAMES)
def test_logits_equal_the_padded_reference(tiny, name):
    spliced = caches(tiny)[name]
    ids = [11, 207, 5, 998, 42, 7]
    ragged = Context(tiny, spliced)
    torch.testing.assert_close(ragged.feed(ids[:4]), padded_logits(tiny, spliced, ids[:4]).float(), atol=1e-5, rtol=0)
    # the tokens fed so far are now part of the cache (appended, attended causally): two more, then one alone
    both = padded_logits(tiny, spliced, ids)
    torch.testing.assert_close(ragged.feed(ids[4:5]), both[4:5].float(), atol=1e-5, rtol=0)
    torch.testing.assert_close(ragged.feed(ids[5:]), both[5:].float(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["mixed", "head-wise virtual"])
def test_a_long_feed_attended_a_few_rows_at_a_time_equals_the_padded_reference(tiny, name, monkeypatch):
    from vkv.lm import ragged_attention

    spliced = caches(tiny)[name]
    ids = [11, 207, 5, 998, 42, 7, 300, 12, 19]
    monkeypatch.setattr(ragged_attention, "SCORE_ELEMENTS", 3 * tiny.spec.num_kv_heads * (spliced.next_position + 9))
    torch.testing.assert_close(
        Context(tiny, spliced).feed(ids), padded_logits(tiny, spliced, ids).float(), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("name", ["compact", "mixed"])
def test_generate_gives_the_padded_references_tokens(tiny, name):
    spliced = caches(tiny)[name]
    prompt = [11, 207, 5]
    greedy = dict(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generate(tiny, spliced, prompt, **greedy), padded_generate(tiny, spliced, prompt, **greedy))
    sampled = dict(max_new_tokens=12, do_sample=True, temperature=1.5, top_k=0, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(3)
    ours = generate(tiny, spliced, prompt, **sampled)
    torch.manual_seed(3)
    theirs = padded_generate(tiny, spliced, prompt, **sampled)
    assert torch.equal(ours, theirs)
    assert len(set(ours[0].tolist())) > 1  # sampling at a high temperature is not stuck on one token


def test_user_generate_with_only_the_model_and_the_cache(tiny):
    """What the README shows: transformers' own generate() on a ragged cache, given `cache.generate_inputs(prompt)`."""
    spliced = caches(tiny)["mixed"]
    cache = tiny.ragged_cache(spliced)
    prompt = torch.tensor([11, 207, 5])
    out = tiny.model.generate(**cache.generate_inputs(prompt), cache=cache, max_new_tokens=6, do_sample=False)
    expected = padded_generate(tiny, spliced, prompt.tolist(), max_new_tokens=6, do_sample=False)
    assert torch.equal(out[:, spliced.next_position + 3 :], expected)


def test_batched_sampling_shares_the_flat_entries(tiny):
    spliced = caches(tiny)["compact"]
    sampled = dict(max_new_tokens=5, do_sample=True, num_return_sequences=3, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    ours = generate(tiny, spliced, [4, 5], **sampled)
    torch.manual_seed(0)
    assert torch.equal(ours, padded_generate(tiny, spliced, [4, 5], **sampled))


def test_bytes_are_the_arithmetic_of_the_entries(tiny):
    spliced = caches(tiny)["mixed"]
    layers, heads, dim = tiny.cache_shape
    cache = tiny.ragged_cache(spliced)
    flat = [s for s in spliced.segments if s.bias is not None and not bool(torch.isfinite(s.bias).all())]
    dense = [s for s in spliced.segments if s not in flat]
    reached = sum(int(torch.isfinite(s.bias).sum()) for s in flat)
    dense_rows = layers * heads * sum(s.slots for s in dense)
    offsets = layers * (heads + 1) * 8
    # K and V rows of 4-byte floats; a float32 bias per flat entry, and per dense entry (a dense segment has one)
    expected = reached * (2 * dim * 4 + 4) + dense_rows * (2 * dim * 4 + 4) + offsets
    assert cache.nbytes == expected
    assert sum(s.nbytes for s in cache.segments) + cache.offsets_nbytes == expected
    padded = tiny.ragged_cache(spliced, padded=True)
    assert padded.nbytes == layers * heads * spliced.physical_length * (2 * dim * 4 + 4)
    assert cache.nbytes < padded.nbytes
    # the span [12, 80) holds the compact, the biased virtual and the head-wise virtual segment
    inside = spliced.segments[1:4]
    assert cache.span_nbytes(12, 80) == sum(m.nbytes for m in cache.segments[1:4]) + offsets
    assert [m.span for m in cache.segments[1:4]] == [tuple(s.span) for s in inside]


def test_entries_without_biases_store_none(tiny):
    spliced = caches(tiny)["compact without biases"]
    layers, heads, dim = tiny.cache_shape
    cache = tiny.ragged_cache(spliced)
    assert all(layer.flat.bias is None and layer.bias is None for layer in cache.layers)
    reached = int(torch.isfinite(spliced.segments[1].bias).sum())
    assert cache.nbytes == (reached + layers * heads * 12) * 2 * dim * 4 + layers * (heads + 1) * 8
    assert [m.nbytes for m in cache.segments] == [layers * heads * 12 * 2 * dim * 4, reached * 2 * dim * 4]


def test_cropping_back_after_a_question_restores_the_cache_exactly(tiny):
    spliced = caches(tiny)["mixed"]
    context = Context(tiny, spliced)
    before = [[t.clone() for t in layer.materialize()] for layer in context.cache.layers]
    nbytes, position, first = context.cache.nbytes, context.position, context.feed([3, 4, 5])
    assert context.cache.nbytes > nbytes and context.length == 3
    context.greedy([9, 8, 7], max_new_tokens=4)  # fed and cropped away inside
    assert context.length == 3
    context.rewind(0)
    assert context.position == position and context.cache.nbytes == nbytes  # the fed tokens' memory is gone
    for layer, tensors in zip(context.cache.layers, before):
        assert all(torch.equal(a, b) for a, b in zip(layer.materialize(), tensors))
    torch.testing.assert_close(context.feed([3, 4, 5]), first, atol=0, rtol=0)
    with pytest.raises(VkvError, match="not removable"):
        context.cache.crop(-(context.cache.appended + 1))


def test_a_cache_is_a_transformers_cache_with_the_logical_position(tiny):
    from transformers.cache_utils import Cache

    spliced = caches(tiny)["compact"]
    cache = tiny.ragged_cache(spliced)
    assert isinstance(cache, Cache)
    assert cache.get_seq_length() == spliced.next_position == 80
    assert [layer.loaded for layer in cache.layers] == [12] * len(cache.layers)  # only the system prefix is dense
    inputs = cache.generate_inputs([1, 2])
    assert inputs["input_ids"].shape == inputs["attention_mask"].shape == (1, 82)
    assert bool(inputs["attention_mask"].all())


def test_offsets_that_do_not_match_the_tensors_are_refused_naming_the_field():
    keys, values, bias = torch.zeros(5, 4), torch.zeros(5, 4), torch.zeros(5)
    FlatHeads(keys, values, bias, torch.tensor([0, 2, 5]))
    for offsets in ([0, 2, 6], [1, 2, 5], [0, 3, 2, 5]):
        with pytest.raises(VkvError, match="field offsets") as err:
            FlatHeads(keys, values, bias, torch.tensor(offsets))
        assert "\n" not in str(err.value)
    flat = FlatHeads(keys, values, bias, torch.tensor([0, 2, 5]))
    with pytest.raises(VkvError, match="field offsets"):
        RaggedLayer(torch.zeros(1, 3, 0, 4), torch.zeros(1, 3, 0, 4), None, flat)
    with pytest.raises(VkvError, match="field bias"):
        RaggedLayer(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 4))


def test_a_head_that_reaches_nothing_pads_to_minus_infinity():
    flat = FlatHeads(torch.ones(3, 2), torch.ones(3, 2), torch.zeros(3), torch.tensor([0, 0, 3]))
    keys, values, bias = flat.padded()
    assert keys.shape == (1, 2, 3, 2) and bool((bias[0, 0] == MASKED).all()) and bool((bias[0, 1] == 0).all())
    assert flat.counts == (0, 3) and flat.slots == 3


def test_prefix_cache_keeps_autograd_and_bias(tiny):
    """What distillation feeds on: entries being optimised, with their biases applied."""
    spliced = caches(tiny)["virtual"]
    prefix = spliced.kv()
    keys = [k.clone().requires_grad_(True) for k in prefix.keys]
    prefix.keys = keys
    cache = RaggedCache.from_prefix(prefix, spliced.next_position)
    out = tiny.model(input_ids=torch.tensor([[5, 6]]), cache=cache, use_cache=True)
    torch.testing.assert_close(out.logits[0].detach(), padded_logits(tiny, spliced, [5, 6]), atol=1e-5, rtol=0)
    out.logits.sum().backward()
    assert keys[0].grad is not None and float(keys[0].grad.abs().sum()) > 0


@pytest.mark.parametrize("name", ["mixed", "compact without biases", "verbatim"])
def test_a_files_header_gives_the_bytes_the_loaded_cache_holds(tiny, name, tmp_path):
    """`vkv inspect` computes memory from the header alone; it must be what the decoding cache measures."""
    from vkv.kv.file import cache_metadata, read_header, save_cache
    from vkv.kv.report import report_rows, report_totals, storage
    from vkv.lm.rebuild import load_cache

    spliced = caches(tiny)[name]
    spliced.meta = cache_metadata(tiny)
    path = tmp_path / "c.safetensors"
    save_cache(spliced, path)
    cache = tiny.ragged_cache(load_cache(path, tiny))
    header = read_header(path)
    totals = report_totals(report_rows(header))
    assert totals["memory_bytes"] == cache.nbytes
    assert [r["memory_bytes"] for r in report_rows(header)] == [m.nbytes for m in cache.segments]
    compressed = [s for s in spliced.segments if s.kind != "verbatim"]
    if compressed:
        start, end = compressed[0].span[0], compressed[-1].span[1]
        assert storage(path, header)["compressed_memory_bytes"] == cache.span_nbytes(start, end)


@pytest.mark.parametrize("fast", [True, False])
def test_the_optimisers_forward_on_a_ragged_prefix_equals_the_padded_one(tiny, fast):
    """Sequential compression optimises each message on the running cache: its prefix keeps heads ragged, and the
    direct forward (and the model's own, recording) pads one layer at a time to the same numbers."""
    spliced = caches(tiny)["mixed"]
    ragged, padded = tiny.prefix(spliced), spliced.kv()
    assert ragged.flat is not None and sum(f.nbytes for f in ragged.flat) < sum(k.nbytes for k in padded.keys)
    embeds = torch.randn(2, 5, tiny.spec.hidden_size, generator=torch.Generator().manual_seed(0))
    positions = torch.linspace(86, 90, 5)
    with torch.no_grad():
        got = tiny.forward_kv(embeds, positions, ragged, fast=fast)
        want = tiny.forward_kv(embeds, positions, padded, fast=fast)
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    with pytest.raises(VkvError, match="cannot be sliced"):
        ragged.slice(0, 3)
