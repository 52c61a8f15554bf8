"""`Session.compress(method=...)`: any registered KV method with a budget compresses a session's messages one by one
on the running cache, by the same path as that method's per-turn mode in `vkv eval`, and the session answers from it."""

import pytest
import torch

import vkv
from tests.conftest import FIXTURES
from vkv.api.session import message_dict
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.methods import get_method
from vkv.text.transcript import load_transcript

RATIO = 4.0


@pytest.mark.parametrize("name", ["kvzip", "snapkv", "knorm"])
def test_a_session_compressed_by_a_method_holds_the_per_turn_evals_entries(tiny_llama, name):
    transcript = load_transcript(FIXTURES / "mini-agent.json")
    session = vkv.Session(tiny_llama)
    session.extend([message_dict(m) for m in transcript.messages])
    first, last = transcript.default_span()
    segments = session.compress((first, last), RATIO, method=get_method(name))
    evaluation = TranscriptEval(tiny_llama, transcript, settings=EvalSettings(max_new_tokens=1))
    torch.manual_seed(0)
    expected = get_method(name, per_turn=True).compress(evaluation.work, RATIO)
    assert len(segments) == len(expected) == last - first
    for got, want in zip(segments, expected):
        assert got.span == want.span
        torch.testing.assert_close(
            got.keys, want.keys, atol=1e-5, rtol=1e-4
        )  # its verbatim prefix was fed message by message
        torch.testing.assert_close(
            got.values, want.values, atol=1e-5, rtol=1e-4
        )  # its verbatim prefix was fed message by message
    assert session.cache.next_position == len(session.ids)
    assert session.ask("Which library hashes passwords?", max_new_tokens=2) is not None


def test_a_method_without_a_per_message_mode_is_refused(tiny_llama):
    session = vkv.Session(tiny_llama)
    session.extend([{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi, what next?"}])
    for method in (get_method("longcodezip"), get_method("full"), "longcodezip", 42):
        with pytest.raises(VkvError, match="cannot compress a session's messages"):
            session.compress((0, 2), 2.0, method=method)
    assert all(s.kind == "verbatim" for s in session.cache.segments)  # unchanged
