"""The per-head hybrid with attention matching's compaction as its verbatim part (verbatim_source am): each KV head
holds am's kept keys with their fitted biases and refitted values, and virtual tokens for the rest of its budget."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.conftest import FIXTURES
from vkv.api.compress import compress_with
from vkv.api.session import Session
from vkv.compress.budget import span_budget
from vkv.compress.compaction import Compaction
from vkv.compress.config import CompressConfig
from vkv.compress.head_hybrid import HeadSplit, Verbatim
from vkv.compress.optimise import OptimConfig
from vkv.compress.recipe import VkvRecipe
from vkv.compress.sequential import FullHistory
from vkv.compress.span import compress_span
from vkv.compress.turn import message_turns, view_on_cache
from vkv.compress.work import TurnWork
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.flat import MASKED
from vkv.kv.spliced import SplicedCache
from vkv.methods import get_method
from vkv.methods.am import AttentionMatching
from vkv.text.transcript import load_transcript, render


def test_fitted_places_each_heads_kept_entries_in_the_span_layout():
    """Two rows (one layer, two heads) over five entries: kept entries carry their β and refitted values, padding
    slots change nothing, and every other entry of the head is masked with its own values untouched."""
    keys, values = torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3)
    compaction = Compaction(
        index=torch.tensor([[1, 3], [4, 4]]),
        bias=torch.tensor([[0.5, -1.0], [2.0, MASKED]]),
        values=torch.arange(12.0).reshape(2, 2, 3),
        real=torch.tensor([[True, True], [True, False]]),
    )
    verbatim = Verbatim.fitted(keys, values, compaction)
    assert verbatim.kept.tolist() == [[[False, True, False, True, False], [False, False, False, False, True]]]
    assert verbatim.bias[0, 0, 1] == 0.5 and verbatim.bias[0, 0, 3] == -1.0 and verbatim.bias[0, 1, 4] == 2.0
    refit = verbatim.span_kv.values[0][0]
    assert torch.equal(refit[0, 1], compaction.values[0, 0]) and torch.equal(refit[0, 3], compaction.values[0, 1])
    assert torch.equal(refit[1, 4], compaction.values[1, 0])  # the padding slot's copy did not overwrite it
    untouched = ~verbatim.kept[0]
    assert torch.equal(refit[untouched], values[0][untouched])
    assert torch.equal(verbatim.span_kv.keys[0][0], keys[0])


@pytest.fixture(scope="module")
def evaluation(tiny_llama):
    return TranscriptEval(
        tiny_llama, load_transcript(FIXTURES / "mini-agent.json"), settings=EvalSettings(max_new_tokens=2)
    )


def assert_holds_fit(segment, compaction, keys: torch.Tensor) -> int:
    """Every key am kept for a head is held once by the segment, as the model computed it, with am's β and refitted
    value; returns how many entries am kept over all heads."""
    layers, heads = keys.shape[:2]
    kept = 0
    for layer in range(layers):
        for head in range(heads):
            row = layer * heads + head
            real = compaction.real[row]
            index, beta, refit = compaction.index[row][real], compaction.bias[row][real], compaction.values[row][real]
            reach = torch.isfinite(segment.bias[layer, head])
            held = segment.keys[layer, head][reach]
            own = torch.tensor([int(((held - keys[layer, head, i]).abs().amax(-1) == 0).sum()) for i in index])
            assert bool((own == 1).all())
            slots = reach.nonzero()[:, 0]
            for i, b, v in zip(index, beta, refit):
                slot = slots[((held - keys[layer, head, i]).abs().amax(-1) == 0).nonzero()[0, 0]]
                torch.testing.assert_close(segment.bias[layer, head, slot], b.float())
                torch.testing.assert_close(segment.values[layer, head, slot], v.float())
            kept += len(index)
    return kept


def test_each_head_keeps_ams_fitted_entries_and_virtual_tokens_fill_its_budget(evaluation):
    work = evaluation.work
    recipe = CompressConfig(
        head_budget="uniform", verbatim_share=0.5, verbatim_source="am", oversample=2.0, optim=OptimConfig(steps=1)
    )
    budget = work.budget(3.0)
    segment = get_method("vkv", recipe=recipe).compress(work, 3.0)
    # am's share is spread by the recipe's head budget, the rule its virtual share follows: each head the same count
    compaction, _ = AttentionMatching(head_budget="uniform").compaction(work, HeadSplit.of(budget, 0.5).verbatim)
    assert bool((compaction.real.sum(-1) == HeadSplit.of(budget, 0.5).verbatim).all())
    keys, _ = work.span_kv()
    layers, heads = keys.shape[:2]
    assert segment.real_entries == pytest.approx(budget)  # am's share and the virtual tokens together meet it
    own_total = assert_holds_fit(segment, compaction, keys)
    assert own_total == pytest.approx(layers * heads * HeadSplit.of(budget, 0.5).verbatim, abs=layers * heads)
    result = evaluation.evaluate(get_method("vkv", recipe=recipe), 3.0)
    assert result["config"]["compress"]["verbatim_source"] == "am" and result["compressed_entries"] == pytest.approx(
        budget
    )


AM_SOURCE = CompressConfig(
    head_budget="uniform", verbatim_share=0.5, verbatim_source="am", oversample=2.0, optim=OptimConfig(steps=1)
)


def test_compress_span_runs_the_am_source_recipe_as_the_eval_does(evaluation):
    """`compress_span` (vkv compress, the Python call) and the eval's method vkv are one path: the same segment, bit
    for bit, am's fit included."""
    work = evaluation.work
    torch.manual_seed(0)
    expected = get_method("vkv", recipe=AM_SOURCE).compress(work, 3.0)
    torch.manual_seed(0)
    spliced = compress_span(work.lm, work.ids, work.start, work.end, 3.0, AM_SOURCE, work.message_starts)
    (segment,) = [s for s in spliced.segments if s.kind != "verbatim"]
    for got, want in ((segment.keys, expected.keys), (segment.values, expected.values), (segment.bias, expected.bias)):
        assert torch.equal(got, want)


def test_per_turn_each_turn_keeps_ams_fit_on_the_running_cache(evaluation):
    """Per turn, a message's verbatim part is am's compaction of that message as the model computed it on the running
    cache (here the messages before it, kept whole), with am's β and refitted values."""
    lm, transcript = evaluation.lm, evaluation.transcript
    rendered = render(transcript, lm.tokenizer)
    first = max(range(1, 8), key=lambda i: len(transcript.messages[i].content))  # the longest message
    plan = VkvRecipe(target_source="online", compress=AM_SOURCE)
    spliced = compress_with(lm, transcript, (first, first + 1), get_method("vkv", recipe=plan, per_turn=True), 3.0)
    starts = [s.start for s in rendered.spans]
    (turn,) = message_turns(starts, None, *rendered.token_span(first, first + 1))
    history = FullHistory.capture(lm, rendered.ids, turn.start, turn.end)
    running = SplicedCache()
    for earlier in message_turns(starts, None, 0, turn.start):
        running.append(history.verbatim(earlier))
    view = view_on_cache(lm, running, rendered.ids, turn)
    work = TurnWork.fed(lm, rendered.ids, starts, None, 0, running, turn, view)
    budget = span_budget(turn.length, 3.0)
    fit = AttentionMatching(head_budget=AM_SOURCE.head_budget)
    compaction, _ = fit.compaction(work, HeadSplit.of(budget, 0.5).verbatim)
    (segment,) = [s for s in spliced.segments if s.kind != "verbatim"]
    keys, _ = work.span_kv()
    assert assert_holds_fit(segment, compaction, keys) > 0
    assert segment.real_entries == pytest.approx(budget)


def test_a_session_compresses_with_the_am_source_recipe(evaluation):
    lm, transcript = evaluation.lm, evaluation.transcript
    """With the virtual tokens' logits left as their keys give them, every entry a kvzip-source head reaches has bias
    0; am's fitted β is what makes them differ."""
    neutral = {"virtual_offset": 0.0, "proportional_attention": False}
    for source, fitted in (("kvzip", False), ("am", True)):
        recipe = dataclasses.replace(AM_SOURCE, verbatim_source=source, **neutral)
        session = Session(lm, get_method("vkv", recipe=VkvRecipe(target_source="online", compress=recipe)))
        session.extend(transcript.messages)
        segments = session.compress(turns=(1, 4), ratio=3.0)
        assert len(segments) == 3
        for segment in segments:
            assert bool((segment.bias[torch.isfinite(segment.bias)] != 0).any()) == fitted


def test_am_as_the_verbatim_part_needs_a_verbatim_share():
    with pytest.raises(VkvError, match="field verbatim_source: am fills a verbatim share, and this recipe keeps none"):
        CompressConfig(verbatim_share=0.0, verbatim_source="am").validate()
