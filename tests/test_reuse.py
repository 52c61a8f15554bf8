"""Issue 19, lever 5: a compressed last message carried onto a history compressed again (methods/reuse.py)."""

import pytest
import torch

from tests.conftest import FIXTURES
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.methods import get_method
from vkv.text.transcript import load_transcript

FAST = CompressConfig(optim=OptimConfig(steps=2))


@pytest.fixture(scope="module")
def work(tiny_llama):
    evaluation = TranscriptEval(
        tiny_llama, load_transcript(FIXTURES / "mini-agent.json"), settings=EvalSettings(max_new_tokens=3)
    )
    return evaluation.work


def _carried(work, **options):
    group = get_method("reuse", recipe=FAST, **options).compress(work, 3.0)
    return group, group[-1]


def test_on_an_unchanged_history_reencoding_gives_the_entries_as_they_were(work):
    _, again = _carried(work, history="verbatim", carry="reencode")
    _, kept = _carried(work, history="verbatim", carry="as-is")
    torch.testing.assert_close(again.keys, kept.keys, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(again.values, kept.values, atol=2e-4, rtol=1e-4)


def test_on_a_compressed_history_reencoded_virtual_tokens_follow_it_above_layer_0(work):
    group, again = _carried(work, history="am", carry="reencode")
    _, kept = _carried(work, history="am", carry="as-is")
    split = group.stats["split"]
    assert group[0].kind == "compact" and group[0].span == (work.start, split)
    assert again.kind == "virtual" and again.span == (split, work.end)
    torch.testing.assert_close(again.embeddings, kept.embeddings)  # the same tokens, carried
    torch.testing.assert_close(again.keys[0], kept.keys[0])  # layer 0 sees only the embedding
    assert not torch.allclose(again.values[-1], kept.values[-1], atol=1e-4)  # later layers see the new history


def test_fresh_compresses_the_message_on_the_new_history(work):
    group, fresh = _carried(work, method="am", history="knorm", carry="fresh")
    _, kept = _carried(work, method="am", history="knorm", carry="as-is")
    assert fresh.kind == kept.kind == "compact" and fresh.span == kept.span
    assert fresh.real_entries == kept.real_entries  # the same budget (head-wise padding may differ)
    assert fresh.values.shape != kept.values.shape or not torch.allclose(fresh.values, kept.values)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"method": "am", "carry": "reencode"}, "needs virtual tokens"),
        ({"method": "longcodezip", "carry": "fresh"}, "implemented for methods with a budget"),
        ({"carry": "later"}, "field carry: unknown value"),
        ({"history": "zip"}, "field history: unknown method"),
        ({"history_ratio": 0.5}, "field history_ratio"),
    ],
)
def test_what_reuse_cannot_do_is_refused(work, options, message):
    with pytest.raises(VkvError, match=message):
        _carried(work, **options)


def test_a_span_of_one_message_has_no_history_to_change(work):
    from dataclasses import replace

    last = max(s for s in work.message_starts if s < work.end)
    one = replace(work, start=last, acts=None)
    with pytest.raises(VkvError, match="holds one message"):
        get_method("reuse").compress(one, 3.0)
