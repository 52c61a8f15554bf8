"""The per-head hybrid at a budget of one entry per KV head (a message too short for a virtual token beside its
verbatim entries at this ratio): the share is rounded, so each head keeps its best entry verbatim, chosen as the
recipe's verbatim part is, and nothing is refused or silently dropped."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tests.conftest import FIXTURES
from vkv.api.session import Session
from vkv.compress.autoratio import AutoRatioConfig, choose_ratio
from vkv.compress.config import CompressConfig
from vkv.compress.head_budget import per_head_index
from vkv.compress.head_hybrid import HeadSplit, reached
from vkv.compress.optimise import OptimConfig
from vkv.compress.recipe import VkvRecipe
from vkv.compress.reconstruction import reconstruction_scores
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.report import report_totals
from vkv.kv.segment import Segment
from vkv.methods import get_method
from vkv.methods.am import AttentionMatching
from vkv.text.transcript import load_transcript


@pytest.mark.parametrize(
    ("budget", "share", "verbatim", "virtual"),
    [(1, 0.9, 1, 0), (1, 0.5, 0, 1), (1, 0.0, 0, 1), (2, 0.9, 1, 1), (10, 0.9, 9, 1), (10, 0.99, 9, 1)],
)
def test_a_one_entry_budget_takes_the_share_rounded_and_larger_ones_keep_a_virtual_token(
    budget, share, verbatim, virtual
):
    assert HeadSplit.of(budget, share) == HeadSplit(verbatim, virtual)


@pytest.fixture(scope="module")
def evaluation(tiny_llama):
    return TranscriptEval(
        tiny_llama, load_transcript(FIXTURES / "mini-agent.json"), settings=EvalSettings(max_new_tokens=2)
    )


RECIPE = CompressConfig(head_budget="uniform", verbatim_share=0.9, oversample=2.0, optim=OptimConfig(steps=1))


def held(segment: Segment, keys: torch.Tensor) -> torch.Tensor:
    """`[layers, kv_heads, n]`: which of the span's own keys each head's reached slots hold as they are."""
    reach = torch.isfinite(segment.bias)
    same = (segment.keys[:, :, :, None] == keys[:, :, None]).all(-1)  # [layers, heads, slots, n]
    return (same & reach[..., None]).any(2)


def test_a_one_entry_budget_keeps_each_heads_best_own_entry(evaluation):
    work = evaluation.work
    ratio = float(work.span_length)  # one entry per head
    assert work.budget(ratio) == 1
    segment = get_method("vkv", recipe=dataclasses.replace(RECIPE, verbatim_source="kvzip")).compress(work, ratio)
    best = reached(*per_head_index(reconstruction_scores(work), 1, "uniform"), work.span_length)
    keys, _ = work.span_kv()
    assert segment.kind == "compact" and segment.real_entries == 1
    assert torch.equal(held(segment, keys), best)
    assert bool((segment.bias[torch.isfinite(segment.bias)] == 0).all())  # an own entry stands for itself
    assert segment.stats["virtual_per_head"] == 0 and segment.stats["loss"] is None


def test_a_one_entry_budget_with_the_am_source_keeps_ams_one_entry_fit(evaluation):
    work = evaluation.work
    ratio = float(work.span_length)
    segment = get_method("vkv", recipe=dataclasses.replace(RECIPE, verbatim_source="am")).compress(work, ratio)
    compaction, _ = AttentionMatching().compaction(work, 1)
    keys, _ = work.span_kv()
    layers, heads = keys.shape[:2]
    reach = torch.isfinite(segment.bias)
    assert segment.real_entries == 1
    for row in range(layers * heads):
        layer, head = divmod(row, heads)
        (index,) = compaction.index[row][compaction.real[row]].tolist()
        (slot,) = reach[layer, head].nonzero()[:, 0].tolist()
        assert torch.equal(segment.keys[layer, head, slot], keys[layer, head, index])
        torch.testing.assert_close(segment.bias[layer, head, slot], compaction.bias[row, 0].float())
        torch.testing.assert_close(segment.values[layer, head, slot], compaction.values[row, 0].float())


@pytest.mark.parametrize("source", ["kvzip", "am"])
def test_a_session_at_16x_compresses_its_short_messages_and_saves_them(tiny_llama, tmp_path, source):
    """The default recipe (one optimiser step) per message at 16×: the two short messages keep one entry per head,
    count as compressed, and come back from a saved session as they were."""
    transcript = load_transcript(FIXTURES / "mini-agent.json")
    recipe = CompressConfig(verbatim_source=source, optim=OptimConfig(steps=1))
    session = Session(tiny_llama, get_method("vkv", recipe=VkvRecipe(target_source="online", compress=recipe)))
    session.extend(transcript.messages)
    segments = session.compress(turns=(1, len(transcript.messages)), ratio=16.0)
    short = [s for s in segments if s.stats.get("virtual_per_head") == 0]
    assert len(short) == 2 and all(s.real_entries == pytest.approx(1) for s in short)
    assert None in session.losses
    totals = report_totals(session.report())
    assert totals["compressed_tokens"] == sum(s.original_tokens for s in segments)
    path = tmp_path / "session.safetensors"
    session.save(path)
    again = Session.load(path, tiny_llama)
    for saved, loaded in zip(session.cache.segments, again.cache.segments):
        assert saved.kind == loaded.kind
        for a, b in ((saved.keys, loaded.keys), (saved.values, loaded.values)):
            torch.testing.assert_close(a.float(), b.float())
    assert again.ask("What failed?", max_new_tokens=2) == session.ask("What failed?", max_new_tokens=2)


def test_auto_ratio_does_not_choose_a_segment_whose_loss_cannot_be_measured():
    """A ladder step that keeps each head's entry verbatim has no V loss: it is not within any tolerance."""
    empty = torch.zeros(1, 1, 1, 1)

    def build(entries: int) -> Segment:
        loss = None if entries == 1 else 0.0
        return Segment("compact", (0, 8), empty, empty, torch.zeros(1), stats={"loss": loss})

    segment = choose_ratio(8, build, lambda: None, AutoRatioConfig(1.0, (2.0, 8.0)))
    assert segment.stats["auto_ratio"]["chosen"] == 2.0 and segment.stats["auto_ratio"]["tried"]["8.0"] is None
    json.dumps(segment.stats)


def test_vkv_compress_and_inspect_a_span_of_one_entry_per_head(mini_transcript_path, tmp_path, capsys):
    """From the command line: a message compressed at its own length keeps one entry per head, and inspect shows the
    file (no loss to print)."""
    from vkv.cli import main

    out, summary = tmp_path / "one.safetensors", tmp_path / "one.json"
    argv = ["compress", str(mini_transcript_path), "--model", "smollm2-135m", "--span", "turns:5-5", "--ratio", "14"]
    assert main([*argv, "--method", "vkv", "--steps", "1", "--out", str(out), "--json", str(summary)]) == 0
    written = json.loads(summary.read_text())
    assert (
        written["span_tokens"] == 14 and written["entries_per_head"] == 1 and written["stopped"] == "no virtual token"
    )
    assert main(["inspect", str(out)]) == 0
    assert "compact" in capsys.readouterr().out
