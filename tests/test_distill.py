"""The distillation stage: probes are question-free, the loss is zero for the real span and falls when optimised."""

import pytest
import torch

from vkv.compress.config import CompressConfig
from vkv.compress.distill import DistillConfig, build_probes, distill, summary_request_ids
from vkv.compress.optimise import OptimConfig
from vkv.compress.single import compress_span
from vkv.errors import VkvError
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
