"""Hybrid compression: which tokens stay verbatim, where they sit, and the short-turn rule (tiny model)."""

import warnings

import pytest
import torch

from tests.conftest import shared_mass
from vkv.api.session import Session
from vkv.compress.config import CompressConfig
from vkv.compress.hybrid import HybridConfig, ShortTurnWarning, keep_scores, v_uniqueness, verbatim_share
from vkv.compress.optimise import OptimConfig
from vkv.compress.recipe import VkvRecipe
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.lm.capture import Activations
from vkv.methods import get_method
from vkv.text.transcript import load_transcript

FAST = CompressConfig(head_budget="shared", optim=OptimConfig(steps=2))  # one slot per head: its layout is tested here


@pytest.fixture(scope="module")
def evaluation(tiny_llama):
    from tests.conftest import FIXTURES

    return TranscriptEval(
        tiny_llama, load_transcript(FIXTURES / "mini-agent.json"), settings=EvalSettings(max_new_tokens=2)
    )


def shared_vkv(recipe: CompressConfig, shared: HybridConfig | None = None):
    """vkv keeping one set of tokens verbatim for every head (`--verbatim shared`)."""
    return get_method("vkv", recipe=VkvRecipe(recipe, verbatim="shared", shared=shared or HybridConfig()))


def verbatim_entries(segment):
    return torch.tensor(segment.stats["verbatim_entries"], dtype=torch.long)


@pytest.mark.parametrize("keep_by", ["v-uniqueness", "surprisal"])
def test_verbatim_entries_sit_at_original_positions_with_full_context_kv(evaluation, keep_by):
    work = evaluation.work
    method = shared_vkv(FAST, HybridConfig(0.15, keep_by))
    segment = method.compress(work, 3.2)
    assert segment.slots == work.budget(3.2)  # verbatim and virtual entries together meet the ratio
    kept = verbatim_entries(segment)
    assert len(kept) == round(0.15 * work.span_length) == segment.stats["verbatim_kept"]
    positions = segment.positions[kept]
    assert torch.equal(positions, torch.tensor(segment.stats["verbatim_positions"]).float())
    assert torch.equal(positions, positions.round()) and work.start <= positions.min() and positions.max() < work.end
    original = positions.long()
    for layer in range(work.lm.spec.num_layers):
        assert torch.equal(segment.keys[layer][:, kept], work.kv.keys[layer][0][:, original].float())
        assert torch.equal(segment.values[layer][:, kept], work.kv.values[layer][0][:, original].float())
    assert torch.all(segment.positions[1:] >= segment.positions[:-1])  # entries in position order
    text = [work.lm.tokenizer.decode([work.ids[p]]) for p in original.tolist()]
    assert segment.stats["verbatim_text"] == text
    # proportional attention: a verbatim entry stands for itself, the virtual ones for the rest of the span
    assert torch.all(shared_mass(segment)[kept] == 1) and int(shared_mass(segment).sum()) == work.span_length
    virtual = torch.ones(segment.slots, dtype=torch.bool)
    virtual[kept] = False
    assert shared_mass(segment)[virtual].min() >= 1 and shared_mass(segment)[virtual].sum() == work.span_length - len(
        kept
    )


def test_hybrid_with_head_wise_shares_masks_only_virtual_tokens_and_keeps_the_budget(evaluation):
    work = evaluation.work
    recipe = CompressConfig(head_budget="adaptive", oversample=2.0, optim=OptimConfig(steps=2))
    segment = shared_vkv(recipe, HybridConfig(0.15, "surprisal")).compress(work, 3.2)
    kept = verbatim_entries(segment)
    assert segment.real_entries == pytest.approx(work.budget(3.2))  # what heads reach meets the ratio
    assert segment.slots == len(kept) + 2 * segment.stats["virtual_entries"]  # twice the virtual slots
    assert bool((segment.bias[:, :, kept] == 0).all())  # every head reaches every verbatim token, at weight 1
    assert bool(torch.isinf(segment.bias).any())


def test_hybrid_without_proportional_attention_has_no_mass(evaluation):
    config = CompressConfig(proportional_attention=False, head_budget="shared", optim=OptimConfig(steps=2))
    segment = shared_vkv(config, HybridConfig(0.15, "surprisal")).compress(evaluation.work, 3.2)
    assert shared_mass(segment) is None


def test_hybrid_segments_splice_and_report_the_achieved_ratio(evaluation):
    with pytest.warns(ShortTurnWarning):  # 15% of the span would take 73% of the 4.8× budget
        result = evaluation.evaluate(shared_vkv(FAST), 4.8)
    span = evaluation.end - evaluation.start
    assert result["compressed_entries"] == round(span / 4.8)
    assert result["optimisation"]["verbatim_kept"] + result["optimisation"]["virtual_entries"] == round(span / 4.8)


def test_sequential_hybrid_keeps_each_turns_own_kv(tiny_llama):
    from tests.conftest import FIXTURES

    transcript = load_transcript(FIXTURES / "mini-agent.json")
    session = Session(
        tiny_llama,
        get_method(
            "vkv",
            recipe=VkvRecipe(FAST, "shared", HybridConfig(0.15, max_share=0.9), target_source="online"),
        ),
    )
    session.extend(list(transcript.messages[:4]))
    reference = [s for s in session.cache.segments]  # messages 0-3 verbatim: their real K/V on the same history
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ShortTurnWarning)
        session.compress(turns=(1, 2), ratio=2.0)  # only the first turn: its history is the exact system prompt
    segment = session.cache.segments[1]
    kept = verbatim_entries(segment)
    assert len(kept) > 0
    original = segment.positions[kept].long() - segment.span[0]
    torch.testing.assert_close(segment.values[:, :, kept], reference[1].values[:, :, original], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(segment.keys[:, :, kept], reference[1].keys[:, :, original], atol=1e-5, rtol=1e-5)


def test_v_uniqueness_finds_the_token_unlike_its_neighbours():
    torch.manual_seed(0)
    values = torch.randn(3, 2, 1, 8).expand(3, 2, 20, 8).clone() + 0.01 * torch.randn(3, 2, 20, 8)
    values[:, :, 13] += 5.0
    scores = v_uniqueness(values, neighbours=2)
    assert int(scores.argmax()) == 13
    assert v_uniqueness(values[:, :, :1]).tolist() == [0.0]
    acts = Activations(values, values, torch.tensor([float("nan")] + [1.0] * 18 + [9.0]), 0, 20)
    assert int(keep_scores(acts, HybridConfig(keep_by="surprisal")).argmax()) == 19


def test_short_turn_rule_caps_the_verbatim_share_and_warns(evaluation):
    share = verbatim_share(240, 50, HybridConfig())  # the seed's case: a 240-token turn at 4.8×
    assert (share.wanted, share.kept, share.virtual, share.capped) == (36, 25, 25, True)
    assert verbatim_share(1000, 312, HybridConfig()).capped is False
    assert verbatim_share(10, 1, HybridConfig(max_share=0.9)).kept == 0  # one entry is always virtual
    with pytest.warns(ShortTurnWarning, match="keeping"):
        segment = shared_vkv(FAST).compress(evaluation.work, 6.0)
    assert segment.stats["verbatim_capped"] is True
    assert segment.stats["verbatim_kept"] == int(0.5 * evaluation.work.budget(6.0))


def test_bad_hybrid_settings_are_clear_errors(evaluation):
    with pytest.raises(VkvError, match="field keep_by: unknown value"):
        HybridConfig(keep_by="attention").validate()
    with pytest.raises(VkvError, match=r"field fraction: must be a finite number in \[0, 1\), got 1.5"):
        HybridConfig(fraction=1.5).validate()
    post_rope = CompressConfig(target="kv-post-rope", optim=OptimConfig(steps=1))
    with pytest.raises(VkvError, match="kv-post-rope"):
        shared_vkv(post_rope).compress(evaluation.work, 3.2)


def test_vkv_eval_with_a_shared_verbatim_part_runs_it_end_to_end(mini_transcript_path, tmp_path, capsys):
    """`--method vkv --verbatim shared` keeps one set of tokens verbatim for every head end to end: its settings reach
    it and the result records the mode."""
    import json

    from vkv.cli import main

    out = tmp_path / "eval.json"
    argv = ["eval", str(mini_transcript_path), "--model", "smollm2-135m", "--method", "vkv", "--verbatim", "shared"]
    flags = ["--verbatim-fraction", "0.1", "--steps", "1", "--ratio", "3", "--max-new-tokens", "2", "--json", str(out)]
    assert main([*argv, *flags]) == 0
    (result,) = json.loads(out.read_text())
    assert result["method"] == "vkv" and result["config"]["verbatim"] == "shared"
    assert result["config"]["shared"]["fraction"] == 0.1 and result["config"]["per_turn"] is False


def test_shared_and_per_head_verbatim_parts_combine(evaluation):
    """`verbatim shared+per-head`: every head holds the shared tokens' own K/V at bias 0, then its own share among the
    rest (kvzip's choice) and virtual tokens for what is left: one compact segment that meets the budget per head."""
    work = evaluation.work
    recipe = VkvRecipe(CompressConfig(verbatim_share=0.5, optim=OptimConfig(steps=2)), "shared+per-head")
    segment = get_method("vkv", recipe=recipe).compress(work, 2.0)
    budget, shared = work.budget(2.0), segment.stats["verbatim_positions"]
    assert segment.kind == "compact" and len(shared) == segment.stats["verbatim_kept"] > 0
    assert segment.stats["verbatim_per_head"] == round(0.5 * segment.stats["virtual_entries"])
    assert segment.real_entries == pytest.approx(budget, abs=1.0)  # shared + own + virtual, per head on average
    for layer in range(work.lm.spec.num_layers):
        for head in range(work.lm.spec.num_kv_heads):
            held = torch.isfinite(segment.bias[layer, head])
            keys, bias = segment.keys[layer, head][held], segment.bias[layer, head][held]
            own = work.kv.keys[layer][0, head][shared].float()  # the shared tokens' full-context keys
            match = (keys[None] == own[:, None]).all(-1)  # [shared, held]
            assert bool(match.any(-1).all()), "every head holds every shared token"
            assert torch.all(bias[match.any(0)] == 0)  # a verbatim token stands for itself
    with pytest.raises(VkvError, match="am's compaction beside shared verbatim tokens is not implemented"):
        get_method("vkv", recipe=VkvRecipe(CompressConfig(verbatim_source="am"), "shared+per-head")).compress(work, 2)
