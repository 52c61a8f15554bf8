"""Long contexts in bounded memory: the reconstruction pass's scores and attention matching's statistics, held a few
queries at a time, equal what one chunk of every query gives."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import FIXTURES
from vkv.compress import compaction, reconstruction
from vkv.compress.reconstruction import ReconstructionPass
from vkv.evals.runner import TranscriptEval
from vkv.text.transcript import load_transcript


@pytest.fixture(scope="module")
def work(tiny_llama):
    return TranscriptEval(tiny_llama, load_transcript(FIXTURES / "mini-agent.json")).work


@pytest.mark.parametrize("normalise", ["context", "chunk"])
def test_kvzip_scores_held_a_few_queries_at_a_time_equal_the_whole_chunks(work, monkeypatch, normalise):
    whole = ReconstructionPass.run(work, 128, score=True, normalise=normalise).scores
    heads, entries = work.lm.spec.num_heads, work.end + 200
    monkeypatch.setattr(reconstruction, "SCORE_ELEMENTS", 5 * heads * entries)  # about five queries at a time
    chunked = ReconstructionPass.run(work, 128, score=True, normalise=normalise).scores
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-7)


def test_row_statistics_held_a_few_queries_at_a_time_equal_one_pass(monkeypatch):
    from tests.conftest import random_readout

    readout = random_readout(rows=3, m=50, n=20)
    whole = compaction.row_stats(readout)
    monkeypatch.setattr(compaction, "SCORE_ELEMENTS", 3 * 20 * 4)  # four queries at a time
    chunked = compaction.row_stats(readout)
    for field in ("log_max", "mass", "outputs", "rms", "mean"):
        torch.testing.assert_close(getattr(chunked, field), getattr(whole, field), rtol=1e-5, atol=1e-7)


def test_am_alone_reads_out_without_scoring_and_after_kvzip_reuses_its_scored_pass(tiny_llama, monkeypatch):
    from vkv.methods import get_method

    calls = []
    run = ReconstructionPass.run.__func__
    monkeypatch.setattr(
        ReconstructionPass,
        "run",
        classmethod(lambda cls, *a, **k: calls.append(k.get("score", False)) or run(cls, *a, **k)),
    )
    alone = TranscriptEval(tiny_llama, load_transcript(FIXTURES / "mini-agent.json")).work
    get_method("am").compress(alone, 8.0)
    assert calls == [False]  # the queries only: kvzip's scores are not computed for am
    calls.clear()
    shared = TranscriptEval(tiny_llama, load_transcript(FIXTURES / "mini-agent.json")).work
    get_method("kvzip").compress(shared, 8.0)
    get_method("am").compress(shared, 8.0)
    assert calls == [True]  # one read-out for both: am takes the queries of kvzip's scored pass
