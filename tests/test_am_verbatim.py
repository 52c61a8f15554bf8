"""The per-head hybrid with attention matching's compaction as its verbatim part (verbatim_source am): each KV head
holds am's kept keys with their fitted biases and refitted values, and virtual tokens for the rest of its budget."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import FIXTURES
from vkv.compress.compaction import Compaction
from vkv.compress.config import CompressConfig
from vkv.compress.head_hybrid import HeadSplit, Verbatim
from vkv.compress.optimise import OptimConfig
from vkv.compress.single import compress_span
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.flat import MASKED
from vkv.methods import get_method
from vkv.methods.am import AttentionMatching
from vkv.text.transcript import load_transcript


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


def test_each_head_keeps_ams_fitted_entries_and_virtual_tokens_fill_its_budget(evaluation):
    work = evaluation.work
    recipe = CompressConfig(
        head_budget="uniform", verbatim_share=0.5, verbatim_source="am", oversample=2.0, optim=OptimConfig(steps=1)
    )
    budget = work.budget(3.0)
    segment = get_method("vkv", recipe=recipe).compress(work, 3.0)
    compaction, _ = AttentionMatching().compaction(work, HeadSplit.of(budget, 0.5).verbatim)
    keys, _ = work.span_kv()
    layers, heads = keys.shape[:2]
    assert segment.real_entries == pytest.approx(budget)  # am's share and the virtual tokens together meet it
    own_total = 0
    for layer in range(layers):
        for head in range(heads):
            row = layer * heads + head
            real = compaction.real[row]
            index, beta, refit = compaction.index[row][real], compaction.bias[row][real], compaction.values[row][real]
            reach = torch.isfinite(segment.bias[layer, head])
            held = segment.keys[layer, head][reach]
            own = torch.tensor([int(((held - keys[layer, head, i]).abs().amax(-1) == 0).sum()) for i in index])
            assert bool((own == 1).all())  # every key am kept is held once, as the model computed it
            slots = reach.nonzero()[:, 0]
            for i, b, v in zip(index, beta, refit):
                slot = slots[((held - keys[layer, head, i]).abs().amax(-1) == 0).nonzero()[0, 0]]
                torch.testing.assert_close(segment.bias[layer, head, slot], b.float())
                torch.testing.assert_close(segment.values[layer, head, slot], v.float())
            own_total += len(index)
    assert own_total == pytest.approx(layers * heads * HeadSplit.of(budget, 0.5).verbatim, abs=layers * heads)
    result = evaluation.evaluate(get_method("vkv", recipe=recipe), 3.0)
    assert result["config"]["verbatim_source"] == "am" and result["compressed_entries"] == pytest.approx(budget)


def test_am_as_the_verbatim_part_is_refused_where_it_cannot_run(evaluation):
    work = evaluation.work
    recipe = CompressConfig(head_budget="uniform", verbatim_share=0.5, verbatim_source="am", optim=OptimConfig(steps=1))
    with pytest.raises(VkvError, match="field verbatim_source: am's verbatim part is fitted by the vkv method"):
        compress_span(work.lm, work.ids, work.start, work.end, 3.0, recipe, work.message_starts)
    with pytest.raises(VkvError, match="field verbatim_source: am fills a verbatim share, and this recipe keeps none"):
        CompressConfig(verbatim_share=0.0, verbatim_source="am").validate()
