"""The distillation stage: probes are question-free, the loss is zero for the real span and falls when optimised."""

from dataclasses import replace

import pytest
import torch

from vkv.compress.config import CompressConfig
from vkv.compress.distill import DistillConfig, build_probes, distill, summary_request_ids
from vkv.compress.optimise import OptimConfig
from vkv.compress.reconstruction import read_out_feeds
from vkv.compress.span import compress_span
from vkv.errors import VkvError
from vkv.kv.flat import MASKED
from vkv.kv.prefix import KVPrefix
from vkv.lm.capture import capture_span
from vkv.text.transcript import load_transcript, render


@pytest.fixture(scope="module")
def problem(tiny_llama):
    from tests.conftest import FIXTURES

    rendered = render(load_transcript(FIXTURES / "mini-agent.json"), tiny_llama.tokenizer)
    start, end = rendered.spans[2].start, rendered.spans[4].start
    _, cache = capture_span(tiny_llama, rendered.ids, start, end, keep_cache=True)
    return rendered.ids, start, end, KVPrefix.from_cache(cache)


def test_summary_request_is_a_chat_turn(smol_tokenizer):
    text = smol_tokenizer.decode(summary_request_ids(smol_tokenizer))
    assert "Summarise the conversation" in text and text.rstrip().endswith("assistant")


def test_kl_is_zero_with_the_real_span_and_falls_with_optimisation(tiny_llama, problem):
    ids, start, end, teacher = problem
    config = DistillConfig(steps=6, lr=2e-3, probe_tokens=12)
    probes = build_probes(tiny_llama, ids, end, teacher, config)
    assert len(probes) == 2 and probes[0].ids == ids[end : end + 12]
    prefix = KVPrefix([k[:, :, :start] for k in teacher.keys], [v[:, :, :start] for v in teacher.values])
    real = tiny_llama.embed(torch.tensor(ids[start:end])).float()
    _, exact = distill(tiny_llama, prefix, real, torch.arange(start, end).float(), end, probes, DistillConfig(steps=0))
    assert exact[0] == pytest.approx(0.0, abs=1e-4)
    k = (end - start) // 4
    start_x = real[:k].clone()
    positions = torch.linspace(start, end - 1, k)
    best, trace = distill(tiny_llama, prefix, start_x, positions, end, probes, config)
    assert len(trace) == 7 and min(trace[1:]) < trace[0] and best.shape == start_x.shape


def test_compress_records_the_distillation_stage(tiny_llama, problem):
    ids, start, end, _ = problem
    config = CompressConfig(
        optim=OptimConfig(steps=2), distill=DistillConfig(steps=2, probes=("continuation",), probe_tokens=8)
    )
    spliced = compress_span(tiny_llama, ids, start, end, 4.0, config)
    stats = spliced.segments[1].stats["distill"]
    assert stats["probe_tokens"] == [8] and len(stats["trace"]) == 3
    assert CompressConfig.from_dict(config.to_dict()) == config.validate()
    with pytest.raises(VkvError, match="probes"):
        DistillConfig(probes=("questions",)).validate()


def test_repeat_probes_are_the_span_teacher_forced_in_chunks(tiny_llama, problem):
    """The repeat probe re-reads the span after a request to repeat it (the read-out's feeds), chunk by chunk:
    together the chunks hold every span token once, and nothing else comes from the conversation."""
    ids, start, end, teacher = problem
    config = DistillConfig(steps=1, probes=("repeat",), probe_tokens=16)
    probes = build_probes(tiny_llama, ids, end, teacher, config, start)
    feeds = read_out_feeds(tiny_llama, list(ids[start:end]), start, 16)
    assert [p.ids for p in probes] == [fed for fed, _ in feeds] and len(probes) > 1
    assert sum(len(fed) - first for fed, first in feeds) == end - start
    assert all(p.teacher.shape == (len(p.ids), tiny_llama.spec.vocab_size) for p in probes)
    with pytest.raises(VkvError, match="the repeat probe needs the span's start"):
        build_probes(tiny_llama, ids, end, teacher, config)


def test_probes_in_turn_keep_the_result_only_if_every_probes_loss_fell(tiny_llama, problem):
    ids, start, end, teacher = problem
    config = DistillConfig(steps=3, lr=2e-3, probes=("repeat",), probe_tokens=16, step_tokens=40)
    probes = build_probes(tiny_llama, ids, end, teacher, config, start)
    prefix = teacher.slice(0, start)
    k = (end - start) // 4
    start_x = tiny_llama.embed(torch.tensor(ids[start : start + k])).float()
    best, trace = distill(tiny_llama, prefix, start_x, torch.linspace(start, end - 1, k), end, probes, config)
    assert len(trace) == config.steps + 2  # every probe before, one group per step, every probe after
    assert torch.equal(best, start_x) != (trace[-1] < trace[0])


def test_the_fixed_part_and_the_virtual_bias_enter_the_students_context(tiny_llama, problem):
    """With the whole span as the fixed part (bias 0) and every virtual token masked, the student reads what the
    teacher reads: the KL is zero whatever the embeddings."""
    ids, start, end, teacher = problem
    config = DistillConfig(steps=0, probes=("repeat",), probe_tokens=16)
    probes = build_probes(tiny_llama, ids, end, teacher, config, start)
    span = teacher.slice(start, end)
    layers, heads = len(span.keys), span.keys[0].shape[1]
    fixed = KVPrefix(span.keys, span.values, None, [torch.zeros(1, heads, end - start)] * layers)
    x = torch.randn(3, tiny_llama.spec.hidden_size)
    masked = torch.full((layers, heads, 3), MASKED)
    _, trace = distill(
        tiny_llama, teacher.slice(0, start), x, torch.tensor([5.0, 6, 7]), end, probes, config, fixed, masked
    )
    assert trace[0] == pytest.approx(0.0, abs=1e-4)
    weighed = torch.full_like(masked, 5.0)
    _, open_trace = distill(
        tiny_llama, teacher.slice(0, start), x, torch.tensor([5.0, 6, 7]), end, probes, config, fixed, weighed
    )
    assert open_trace[0] > 1e-3  # weighed up by their bias, the same virtual tokens change what the student reads


def test_distillation_beside_a_per_head_verbatim_share_tunes_only_the_virtual_tokens(tiny_llama, problem):
    ids, start, end, _ = problem
    base = CompressConfig(
        head_budget="uniform", verbatim_share=0.5, verbatim_source="kvzip", oversample=2.0, optim=OptimConfig(steps=2)
    )
    distilled = replace(base, distill=DistillConfig(steps=2, probes=("repeat",), probe_tokens=16))
    plain = [s for s in compress_span(tiny_llama, ids, start, end, 3.0, base).segments if s.kind == "compact"][0]
    tuned = [s for s in compress_span(tiny_llama, ids, start, end, 3.0, distilled).segments if s.kind == "compact"][0]
    stats = tuned.stats["distill"]
    assert stats["best_kl"] <= stats["initial_kl"] and len(stats["trace"]) == 3
    assert torch.equal(torch.isfinite(plain.bias), torch.isfinite(tuned.bias))  # each head holds the same entries
    own = tuned.bias == 0  # the verbatim entries (the virtual tokens carry the offset)
    assert torch.equal(plain.keys[own], tuned.keys[own]) and torch.equal(plain.values[own], tuned.values[own])
