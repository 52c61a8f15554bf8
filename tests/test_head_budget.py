"""Head-wise budgets (uniform, AdaKV's adaptive split, padding masked by −inf) and every budget method per turn."""

from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tests.conftest import FIXTURES
from vkv import upgrade
from vkv.compress.budget import allocate
from vkv.compress.config import DEFAULT_VERBATIM_SHARE, DEFAULT_VERBATIM_SOURCE, DEFAULT_VIRTUAL_OFFSET, CompressConfig
from vkv.compress.head_budget import ADAKV_SAFEGUARD, mask_per_head, per_head_index
from vkv.compress.head_hybrid import HeadSplit, reached
from vkv.compress.hybrid import HybridConfig, HybridRecipe, choose_verbatim, verbatim_share
from vkv.compress.optimise import OptimConfig
from vkv.compress.pooling import Blocks
from vkv.compress.problem import SpanProblem
from vkv.compress.recipe import VkvRecipe
from vkv.compress.reconstruction import ReconstructionPass
from vkv.compress.sequential import FullHistory, compress_virtual_turns
from vkv.compress.span import compress_span
from vkv.compress.turn import message_turns
from vkv.compress.work import SpanWork, TurnWork
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.file import read_header, save_cache
from vkv.kv.report import entries_text, report_rows
from vkv.kv.segment import Segment, verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.context import Context
from vkv.lm.rebuild import load_cache
from vkv.methods import get_method
from vkv.text.transcript import load_transcript


def test_adaptive_budget_gives_spread_heads_more_and_keeps_the_layer_total():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(2, 3, 50, generator=g)
    scores[:, 0] += 1.0  # head 0 outscores the others everywhere
    index, real = per_head_index(scores, 10, "adaptive")
    counts = real.sum(-1)
    assert counts.sum(-1).tolist() == [30, 30]  # budget × heads per layer
    assert (counts >= int(ADAKV_SAFEGUARD * 10)).all() and (counts[:, 0] > counts[:, 1]).all()
    for layer in range(2):
        for head in range(3):
            kept = index[layer, head, : counts[layer, head]]
            assert torch.equal(kept, kept.sort().values) and len(kept.unique()) == len(kept)
            best = scores[layer, head].topk(int(counts[layer, head])).indices.sort().values
            assert torch.equal(kept, best)  # a head's entries are its own best ones
    uniform, all_real = per_head_index(scores, 10, "uniform")
    assert uniform.shape == (2, 3, 10) and bool(all_real.all())
    with pytest.raises(ValueError, match="unknown head budget"):
        per_head_index(scores, 10, "greedy")


def test_global_budget_is_one_threshold_over_every_layer_and_head():
    g = torch.Generator().manual_seed(1)
    scores = torch.rand(3, 2, 40, generator=g)
    scores[1] += 1.0  # layer 1 outscores the others everywhere: a global threshold gives it more, AdaKV does not
    index, real = per_head_index(scores, 8, "global")
    counts = real.sum(-1)
    assert int(counts.sum()) == 8 * 3 * 2 and (counts >= 1).all()
    assert (counts[1] > counts[0]).all() and (counts[1] > counts[2]).all()
    kept = torch.zeros_like(scores, dtype=torch.bool)
    for layer in range(3):
        for head in range(2):
            own = index[layer, head, : counts[layer, head]]
            assert torch.equal(own, own.sort().values) and len(own.unique()) == len(own)
            kept[layer, head, own] = True
    # apart from each head's one guaranteed entry, nothing dropped outscores anything kept
    floor = torch.zeros_like(kept).scatter_(-1, scores.argmax(-1, keepdim=True), True)
    assert scores[~kept].max() <= scores[kept & ~floor].min()
    adaptive = per_head_index(scores, 8, "adaptive")[1].sum(-1)
    assert adaptive.sum(-1).tolist() == [16, 16, 16]


def test_kvzip_spends_its_budget_as_the_reference_does_and_keeps_the_ratio(evaluation):
    kvzip = get_method("kvzip")
    assert kvzip.head_budget == "global"
    work = evaluation.work
    segment = kvzip.compress(work, 3.2)
    real = torch.isfinite(segment.bias) if segment.bias is not None else torch.ones(segment.keys.shape[:3], dtype=bool)
    per_layer = real.sum(dim=(1, 2))
    assert int(real.sum()) == work.budget(3.2) * real.shape[0] * real.shape[1]
    scores = kvzip.score(work, work.budget(3.2))
    assert torch.equal(real.sum(-1), per_head_index(scores, work.budget(3.2), "global")[1].sum(-1))
    assert len(per_layer.unique()) > 1  # layers differ, unlike every per-layer split


@pytest.fixture(scope="module")
def evaluation(tiny_llama):
    return TranscriptEval(
        tiny_llama, load_transcript(FIXTURES / "mini-agent.json"), settings=EvalSettings(max_new_tokens=2)
    )


@pytest.mark.parametrize("name", ["knorm", "kvzip", "am", "kvopt"])
def test_adaptive_heads_keep_the_ratio_and_padding_is_never_attended(evaluation, tmp_path, name):
    work = evaluation.work
    method = get_method(name, head_budget="adaptive")
    segment = method.compress(work, 3.0)
    padding = torch.isinf(segment.bias)
    assert segment.kind == "compact" and bool(padding.any())  # the mini transcript's heads do differ
    assert segment.real_entries == pytest.approx(work.budget(3.0))
    probe = evaluation.questions[0].prompt
    logits = Context(work.lm, evaluation.splice(segment)).feed(probe)
    scrambled = segment.keys.clone()
    scrambled[padding] = torch.randn(int(padding.sum()), scrambled.shape[-1]) * 10
    segment.keys, original = scrambled, segment.keys
    assert torch.equal(Context(work.lm, evaluation.splice(segment)).feed(probe), logits)
    segment.keys = original
    spliced = SplicedCache(meta={"fingerprint": work.lm.fingerprint, "spec": work.lm.spec.to_dict()})
    spliced.append(segment)
    save_cache(spliced, tmp_path / "c.safetensors")
    loaded = load_cache(tmp_path / "c.safetensors", work.lm).segments[0]
    assert torch.equal(loaded.bias, segment.bias)
    assert torch.equal(loaded.keys, segment.keys) and torch.equal(loaded.values, segment.values)
    # the file holds the real entries only: fewer bytes than the padded K/V alone
    with safe_open(str(tmp_path / "c.safetensors"), framework="pt") as f:
        assert f.get_slice("segments.0.keys_real").get_shape()[0] == int(torch.isfinite(segment.bias).sum())
    assert (tmp_path / "c.safetensors").stat().st_size < 2 * segment.keys.numel() * 4
    with safe_open(str(tmp_path / "c.safetensors"), framework="pt") as f:  # a flat file whose tensors disagree
        tensors, header = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    tensors["segments.0.keys_real"] = tensors["segments.0.keys_real"][1:]
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=header)
    with pytest.raises(VkvError, match=r"segments\[0\]\.keys_real: expected \[\d+, \d+\] for the \d+ slots"):
        load_cache(tmp_path / "bad.safetensors", work.lm)
    result = evaluation.evaluate(method, 3.0)
    assert result["ratio_achieved"] == pytest.approx(work.span_length / work.budget(3.0), rel=1e-3)


def test_shared_head_budget_is_the_token_selection_of_before(evaluation):
    work = evaluation.work
    norms = work.acts.keys_pre_rope.norm(dim=-1).mean(dim=(0, 1))
    expected = torch.topk(-norms, work.budget(3.0)).indices.sort().values + work.start
    assert torch.equal(get_method("knorm").compress(work, 3.0).positions.long(), expected)


def test_reconstruction_on_a_running_cache_equals_the_pass_on_the_full_context(evaluation):
    work = evaluation.work
    turn = message_turns(work.message_starts, work.message_roles, work.start, work.end)[2]
    history = SplicedCache()
    history.append(verbatim_segment(work.kv.slice(0, turn.start), 0))
    on_cache = ReconstructionPass.run(TurnWork.on_cache(work, history, turn), 2048, score=True).scores
    direct = SpanWork(work.lm, work.ids, turn.start, turn.end, work.kv, work.acts, work.message_starts)
    torch.testing.assert_close(on_cache, ReconstructionPass.run(direct, 2048, score=True).scores, atol=1e-5, rtol=1e-4)
    history.segments[0].bias = torch.zeros(history.segments[0].keys.shape[:3])  # a zero bias changes nothing
    zero = ReconstructionPass.run(TurnWork.on_cache(work, history, turn), 2048, score=True).scores
    torch.testing.assert_close(zero, on_cache, atol=1e-5, rtol=1e-4)
    history.segments[0].bias[..., :4] = 3.0  # a bias on the context draws the read-out's attention away
    assert not torch.allclose(
        ReconstructionPass.run(TurnWork.on_cache(work, history, turn), 2048, score=True).scores, zero
    )


def test_eval_takes_head_budget_and_method_options_from_the_cli(mini_transcript_path, tmp_path, capsys):
    import json

    from vkv.cli import main

    out = tmp_path / "eval.json"
    argv = [
        "eval",
        str(mini_transcript_path),
        "--model",
        "smollm2-135m",
        "--method",
        "knorm",
        "--ratio",
        "3",
        "--max-new-tokens",
        "2",
    ]
    assert main([*argv, "--head-budget", "adaptive", "--mass", "nearest", "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())
    assert result["config"]["head_budget"] == "adaptive" and result["config"]["mass"] == "nearest"
    assert main([*argv, "--selection", "omp"]) == 2
    assert "--selection: none of the methods knorm has it (am do)" in capsys.readouterr().err
    assert main([*argv, "--max-queries", "many"]) == 2
    assert "argument --max-queries: expected int, got 'many'" in capsys.readouterr().err


def test_masking_per_head_keeps_each_heads_share_and_its_total_weight():
    g = torch.Generator().manual_seed(3)
    scores, per_entry = torch.rand(2, 3, 12, generator=g), torch.rand(12, generator=g).log1p()
    shared = per_entry.expand(2, 3, 12)
    for rule in ("uniform", "adaptive"):
        separable = mask_per_head(scores, per_entry, 4, rule)
        masked = separable.dense()
        kept = torch.isfinite(masked)
        assert torch.equal(kept, separable.real)
        assert int(kept.sum()) == 2 * 3 * 4 and kept.sum(-1).min() >= 1
        if rule == "uniform":
            assert bool((kept.sum(-1) == 4).all())
            assert torch.equal(kept, torch.zeros_like(kept).scatter_(-1, scores.topk(4, -1).indices, True))
        torch.testing.assert_close(masked.logsumexp(-1), shared.logsumexp(-1))
        # per entry plus per head: the kept entries' biases differ from the shared ones by one offset per head
        offset = torch.where(kept, masked - shared, 0).amax(-1)
        torch.testing.assert_close(
            torch.where(kept, masked - shared, offset[..., None]), offset[..., None].expand_as(kept)
        )


@pytest.mark.parametrize("rule", ["uniform", "adaptive"])
def test_virtual_tokens_with_head_wise_budgets_keep_the_ratio_and_survive_an_embeddings_file(
    evaluation, tmp_path, rule
):
    """Twice the budget's virtual tokens, each KV head attending to its share: the ratio counts what heads reach."""
    work = evaluation.work
    recipe = CompressConfig(
        head_budget=rule, share_scores="readout", verbatim_share=0.0, oversample=2.0, optim=OptimConfig(steps=1)
    )
    segment = get_method("vkv", recipe=recipe).compress(work, 3.0)
    budget = work.budget(3.0)
    assert segment.kind == "virtual" and segment.slots == min(work.span_length, 2 * budget)
    assert segment.real_entries == pytest.approx(budget)
    spliced = evaluation.splice(segment)
    spliced.meta.update({"fingerprint": work.lm.fingerprint, "spec": work.lm.spec.to_dict()})
    save_cache(spliced, tmp_path / "e.safetensors", store="embeddings", ids=work.ids)
    with safe_open(str(tmp_path / "e.safetensors"), framework="pt") as f:  # the bias as numbers per entry and head
        names = set(f.keys())
    assert "segments.1.bias" not in names and {"segments.1.bias_per_entry", "segments.1.bias_mask"} <= names
    loaded = load_cache(tmp_path / "e.safetensors", work.lm)
    assert torch.equal(loaded.attention_bias(), spliced.attention_bias())  # bit for bit
    assert torch.equal(loaded.segments[1].separable.real, torch.isfinite(segment.bias))
    save_cache(spliced, tmp_path / "k.safetensors")  # a K/V file: the real entries only, though masks interleave
    with safe_open(str(tmp_path / "k.safetensors"), framework="pt") as f:
        assert f.get_slice("segments.1.keys_real").get_shape()[0] == int(torch.isfinite(segment.bias).sum())
    reloaded = load_cache(tmp_path / "k.safetensors", work.lm)
    real = torch.isfinite(segment.bias)
    assert torch.equal(reloaded.segments[1].bias, segment.bias)
    assert torch.equal(reloaded.segments[1].keys[real], segment.keys[real])
    probe = evaluation.questions[0].prompt
    assert torch.equal(Context(work.lm, reloaded).feed(probe), Context(work.lm, spliced).feed(probe))
    row = [r for r in report_rows(read_header(tmp_path / "e.safetensors")) if r["kind"] == "virtual"][0]
    assert row["entries"] == pytest.approx(budget) and row["slots"] == segment.slots  # the report counts reach
    assert row["ratio"] == pytest.approx(work.span_length / budget, abs=1e-3)
    assert entries_text(row) == f"{row['entries']:g} of {segment.slots} slots"
    result = evaluation.evaluate(get_method("vkv", recipe=recipe), 3.0)
    assert result["compressed_entries"] == pytest.approx(budget)
    assert result["stored_entries"] == min(work.span_length, 2 * budget)


def test_fitted_biases_with_head_wise_shares_keep_each_heads_entries_and_fit_only_those(evaluation):
    """am's order: each head's entries are chosen first, then their biases fitted; the masks stay where they were."""
    from vkv.compress.problem import SpanProblem
    from vkv.lm.capture import capture_span

    work = evaluation.work
    segments = {
        fit: get_method(
            "vkv",
            recipe=CompressConfig(
                head_budget="adaptive", share_scores="readout", fit_bias=fit, optim=OptimConfig(steps=1)
            ),
        ).compress(work, 3.0)
        for fit in (False, True)
    }
    masked, fitted = segments[False].bias, segments[True].bias
    assert torch.equal(segments[False].keys, segments[True].keys)  # the same embeddings: fitting comes after
    assert torch.equal(fitted.isneginf(), masked.isneginf()) and not torch.allclose(fitted, masked)
    acts, _ = capture_span(work.lm, work.ids[: work.end], work.start, work.end, queries=True)
    config = CompressConfig(head_budget="adaptive", share_scores="readout", fit_bias=True).validate()
    readout = SpanProblem.build(work.lm, work.ids, acts, segments[True].slots, config).readout

    def error(bias):
        scores = readout.queries @ segments[True].keys.transpose(-1, -2) + bias[:, :, None, :]
        return (scores.logsumexp(-1) - readout.log_norm).exp().sub(1).pow(2).sum()

    assert error(fitted) < error(masked)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"head_budget": "uniform", "oversample": 1.0}, "field oversample: must be a finite number above 1"),
        ({"head_budget": "greedy"}, "field head_budget: unknown value"),
    ],
)
def test_head_wise_virtual_budgets_refuse_settings_that_do_nothing(options, message):
    with pytest.raises(VkvError, match=message):
        CompressConfig(**options).validate()


def test_a_blocks_most_is_the_largest_score_among_its_tokens():
    blocks = Blocks((0, 2, 3, 7))
    per_token = torch.tensor([[[1.0, 5.0, 2.0, 0.0, 9.0, 3.0, 4.0]]])
    assert torch.equal(blocks.most(per_token), torch.tensor([[[5.0, 2.0, 9.0]]]))


def test_virtual_tokens_rank_each_heads_share_by_the_reconstruction_pass_when_asked(evaluation):
    """share_scores=reconstruction: each head keeps the virtual tokens whose blocks hold its most KVzip-important
    tokens, the same from `vkv compress` (compress_span) as from the method in an eval."""
    work = evaluation.work
    recipe = CompressConfig(
        head_budget="uniform", verbatim_share=0.0, oversample=2.0, optim=OptimConfig(steps=1)
    ).validate()
    budget = work.budget(3.0)
    segment = get_method("vkv", recipe=recipe).compress(work, 3.0)
    scores = ReconstructionPass.run(work, 2048, score=True).scores
    k = recipe.virtual_tokens(budget, work.span_length)
    blocks = SpanProblem.build(work.lm, work.ids, work.acts, k, recipe, work.message_starts, token_scores=scores).blocks
    best = blocks.most(scores).topk(budget, dim=-1).indices
    kept = torch.isfinite(segment.bias)
    assert torch.equal(kept, torch.zeros_like(kept).scatter_(-1, best, True))
    by_readout = get_method("vkv", recipe=replace(recipe, share_scores="readout")).compress(work, 3.0)
    assert not torch.equal(torch.isfinite(by_readout.bias), kept)  # the two rankings choose differently here
    spliced = compress_span(work.lm, work.ids, work.start, work.end, 3.0, recipe, work.message_starts)
    (virtual,) = [s for s in spliced.segments if s.kind == "virtual"]
    assert torch.equal(torch.isfinite(virtual.bias), kept)
    with pytest.raises(VkvError, match="share_scores=reconstruction ranks each head's share by the reconstruction"):
        SpanProblem.build(work.lm, work.ids, work.acts, k, recipe, work.message_starts)  # a path that ran no pass


@pytest.mark.parametrize("rule", ["uniform", "adaptive"])
def test_per_head_hybrid_keeps_each_heads_kvzip_best_verbatim_and_virtual_tokens_for_what_it_dropped(
    evaluation, rule, tmp_path
):
    """verbatim_share: each head reaches its best own entries by KVzip's importance (bias 0, the span's K/V as the
    model computed them) and, for the rest of its budget, the virtual tokens whose blocks hold the most important
    token it dropped, each weighted by the tokens of its block the head does not hold; a compact segment holds, per
    head, only those, in position order; the ratio counts both parts."""
    work = evaluation.work
    recipe = CompressConfig(
        head_budget=rule,
        verbatim_share=0.5,
        verbatim_source="kvzip",
        proportional_attention=True,  # so a virtual token's bias says which block it stands for
        oversample=2.0,
        optim=OptimConfig(steps=1),
    )
    budget, n, start = work.budget(3.0), work.span_length, work.start
    split = HeadSplit.of(budget, 0.5)
    segment = get_method("vkv", recipe=recipe).compress(work, 3.0)
    k = recipe.virtual_tokens(split.virtual, n)
    reach = torch.isfinite(segment.bias)
    assert segment.kind == "compact" and segment.slots == int(reach.sum(-1).max()) and segment.embeddings is None
    assert segment.real_entries == pytest.approx(budget)  # verbatim and virtual entries together meet the budget
    if rule == "uniform":
        assert segment.slots == budget  # memory: the budget's slots per head, no more
    scores = ReconstructionPass.run(work, 2048, score=True).scores
    verbatim = reached(*per_head_index(scores, split.verbatim, rule), n)
    problem = SpanProblem.build(
        work.lm, work.ids, work.acts, k, recipe.validate(), work.message_starts, token_scores=scores
    )
    blocks = problem.blocks
    left = scores.masked_fill(verbatim, float("-inf"))
    wanted = reached(*per_head_index(blocks.most(left), split.virtual, rule), blocks.count)
    block = torch.repeat_interleave(torch.arange(blocks.count), blocks.sizes().long())
    dropped = torch.zeros(*verbatim.shape[:2], blocks.count).index_add_(-1, block, (~verbatim).float())
    keys, values = work.span_kv()
    positions = torch.cat([torch.arange(start, work.end).float(), problem.positions.float()])
    order = positions.argsort(stable=True)  # own entries before virtual tokens at the same position
    for layer in range(verbatim.shape[0]):
        for head in range(verbatim.shape[1]):
            picked = order[torch.cat([verbatim[layer, head], wanted[layer, head]])[order]]  # this head's, in order
            count = len(picked)
            assert int(reach[layer, head].sum()) == count and bool(reach[layer, head, :count].all())
            own, slots = picked < n, torch.arange(count)
            torch.testing.assert_close(segment.keys[layer, head, slots[own]], keys[layer, head, picked[own]])
            torch.testing.assert_close(segment.values[layer, head, slots[own]], values[layer, head, picked[own]])
            assert bool((segment.bias[layer, head, slots[own]] == 0).all())
            expected = dropped[layer, head, picked[~own] - n].log() + DEFAULT_VIRTUAL_OFFSET  # the default offset
            torch.testing.assert_close(segment.bias[layer, head, slots[~own]], expected)
    result = evaluation.evaluate(get_method("vkv", recipe=recipe), 3.0)
    assert result["compressed_entries"] == pytest.approx(budget) and result["ratio_memory"] > 2.0
    spliced = compress_span(work.lm, work.ids, work.start, work.end, 3.0, recipe, work.message_starts)
    (compact,) = [s for s in spliced.segments if s.kind == "compact"]  # `vkv compress` keeps the same entries
    assert torch.equal(torch.isfinite(compact.bias), reach)
    assert spliced.physical_length < len(work.ids)  # the span's slots are the budget's, not its tokens'
    spliced.meta.update({"fingerprint": work.lm.fingerprint, "spec": work.lm.spec.to_dict()})
    with pytest.raises(VkvError, match="a compact segment holds entries chosen per head"):
        save_cache(spliced, tmp_path / "e.safetensors", store="embeddings", ids=work.ids)
    save_cache(spliced, tmp_path / "k.safetensors")  # a K/V file keeps what the heads reach, bit for bit
    reloaded = load_cache(tmp_path / "k.safetensors", work.lm)
    (back,) = [s for s in reloaded.segments if s.kind == "compact"]
    assert torch.equal(back.bias, compact.bias) and torch.equal(back.keys[reach], compact.keys[reach])


def test_virtual_offset_shifts_only_the_virtual_tokens_logits_beside_verbatim_entries(evaluation):
    """virtual_offset adds one number to the bias of every virtual token a head reaches and to nothing else: the same
    optimisation gives the same keys and values, each head's own entries keep bias 0, and a very negative offset leaves
    the read-out of each head's verbatim entries alone."""
    work = evaluation.work
    base = CompressConfig(
        head_budget="uniform",
        verbatim_share=0.5,
        verbatim_source="kvzip",  # own entries at bias 0, so that only the offset moves a bias
        virtual_offset=0.0,
        oversample=2.0,
        optim=OptimConfig(steps=1),
    )
    plain = get_method("vkv", recipe=base).compress(work, 3.0)
    shifted = get_method("vkv", recipe=replace(base, virtual_offset=-3.0)).compress(work, 3.0)
    split = HeadSplit.of(work.budget(3.0), 0.5)
    assert torch.equal(shifted.keys, plain.keys) and torch.equal(shifted.values, plain.values)
    reach = torch.isfinite(plain.bias)
    assert torch.equal(torch.isfinite(shifted.bias), reach)
    moved = (shifted.bias - plain.bias)[reach]
    assert bool(((moved == 0) | (moved == -3.0)).all())
    assert bool(((shifted.bias - plain.bias).nan_to_num(0.0) == -3.0).sum(-1).eq(split.virtual).all())
    assert bool((plain.bias[reach] == 0).all())  # proportional attention off beside verbatim entries
    gone = get_method("vkv", recipe=replace(base, virtual_offset=-30.0)).compress(work, 3.0)
    own = gone.bias == 0
    query = torch.randn(*gone.keys.shape[:2], 4, gone.keys.shape[-1], generator=torch.Generator().manual_seed(0))

    def attend(bias: torch.Tensor) -> torch.Tensor:
        return ((query @ gone.keys.transpose(-1, -2)) + bias[:, :, None]).softmax(-1) @ gone.values

    torch.testing.assert_close(attend(gone.bias), attend(gone.bias.masked_fill(~own, float("-inf"))))


def test_a_compacted_segment_holds_each_heads_reached_entries_and_attends_the_same():
    """Compacting keeps each head's reached entries (finite bias) in slot order and nothing else, so attention over
    it equals attention over the original for any query."""
    g = torch.Generator().manual_seed(0)
    layers, heads, slots, dim = 2, 3, 9, 4
    keys, values = (
        torch.randn(layers, heads, slots, dim, generator=g),
        torch.randn(layers, heads, slots, dim, generator=g),
    )
    bias = torch.randn(layers, heads, slots, generator=g)
    bias[torch.rand(layers, heads, slots, generator=g) < 0.6] = float("-inf")
    bias[0, 0, 3] = 0.5  # every head reaches something
    bias[..., 0] = torch.where(torch.isfinite(bias[..., 0]), bias[..., 0], torch.tensor(0.1))
    segment = Segment("virtual", (10, 30), keys, values, torch.linspace(10, 29, slots), torch.randn(slots, 5), {}, bias)
    compact = segment.compacted()
    reach = torch.isfinite(bias)
    assert compact.kind == "compact" and compact.slots == int(reach.sum(-1).max()) and compact.embeddings is None
    assert compact.real_entries == segment.real_entries
    query = torch.randn(layers, heads, 5, dim, generator=g)

    def attend(s: Segment) -> torch.Tensor:
        return ((query @ s.keys.transpose(-1, -2)) + s.bias[:, :, None]).softmax(-1) @ s.values

    torch.testing.assert_close(attend(compact), attend(segment))
    for layer in range(layers):
        for head in range(heads):
            count = int(reach[layer, head].sum())
            assert torch.equal(compact.keys[layer, head, :count], keys[layer, head, reach[layer, head]])
            assert bool(compact.bias[layer, head, count:].isneginf().all())


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"verbatim_share": 0.5, "share_scores": "readout"},
            "field verbatim_share: each head's verbatim entries are chosen by the reconstruction",
        ),
        (
            {"verbatim_share": 1.0, "share_scores": "reconstruction"},
            r"field verbatim_share: must be a finite number in \[0, 1\), got 1.0",
        ),
        (
            {"verbatim_share": 0.5, "share_scores": "reconstruction", "fit_bias": True},
            "field verbatim_share: fit_bias is not implemented beside verbatim entries",
        ),
        ({"verbatim_share": 0.0, "virtual_offset": -2.0}, "field virtual_offset: it weighs virtual tokens against"),
        ({"head_budget": "shared", "virtual_offset": -2.0}, "field virtual_offset: it weighs virtual tokens against"),
        ({"virtual_offset": float("-inf")}, "field virtual_offset: must be a finite number at least -30"),
    ],
)
def test_per_head_hybrid_refuses_what_it_does_not_implement(options, message):
    with pytest.raises(VkvError, match=message):
        CompressConfig(**options).validate()


def test_default_recipe_keeps_a_per_head_verbatim_share_where_the_recipe_allows_one():
    """The default share and proportional attention follow the rest of the recipe, resolved where it is validated (so
    what runs is what is recorded); an explicit value is kept, and an older file's recipe keeps the meaning it had."""
    default = CompressConfig().validate()
    assert (
        default.share_scores,
        default.verbatim_share,
        default.verbatim_source,
        default.proportional_attention,
        default.virtual_offset,
    ) == ("reconstruction", DEFAULT_VERBATIM_SHARE, DEFAULT_VERBATIM_SOURCE, False, DEFAULT_VIRTUAL_OFFSET)
    for virtual_only in ({"head_budget": "shared"}, {"share_scores": "readout"}, {"fit_bias": True}):
        config = CompressConfig(**virtual_only).validate()
        assert config.verbatim_share == 0.0 and config.proportional_attention is True and config.virtual_offset == 0
        assert config.verbatim_source == "kvzip"  # no verbatim part to fit
    assert CompressConfig(verbatim_share=0.5, verbatim_source="kvzip").validate().verbatim_source == "kvzip"
    saved = {"verbatim_share": 0.9, "share_scores": "reconstruction", "virtual_offset": -4.0}  # before am's source
    assert CompressConfig.from_dict(upgrade.recipe(saved)).validate().verbatim_source == "kvzip"
    assert CompressConfig(verbatim_share=0.5, virtual_offset=-1).validate().virtual_offset == -1
    assert CompressConfig(verbatim_share=0.0).validate().proportional_attention is True
    assert CompressConfig(proportional_attention=True).validate().proportional_attention is True
    assert HybridRecipe().validate().verbatim_share == 0.0  # the turn-level hybrid keeps its own verbatim tokens
    assert VkvRecipe(verbatim="shared").validate().compress.verbatim_share == 0.0
    with pytest.raises(
        VkvError, match="field verbatim_share: verbatim shared keeps one set of tokens .* shared.per-head"
    ):
        VkvRecipe(CompressConfig(verbatim_share=0.5), verbatim="shared").validate()  # before any work
    both = VkvRecipe(CompressConfig(verbatim_share=0.5), verbatim="shared+per-head").validate()
    assert (both.compress.verbatim_share, both.compress.verbatim_source) == (0.5, "kvzip")  # am's fit: whole spans
    with pytest.raises(VkvError, match="field verbatim_source: am's compaction beside shared verbatim tokens"):
        VkvRecipe(CompressConfig(verbatim_source="am"), verbatim="shared+per-head").validate()
    with pytest.raises(VkvError, match="field proportional_attention: expected bool or None, got 'yes'"):
        CompressConfig(proportional_attention="yes").validate()
    with pytest.raises(VkvError, match="field verbatim_share: expected float or None, got True"):
        CompressConfig(verbatim_share=True).validate()
    with pytest.raises(VkvError, match="field virtual_offset: expected float or None, got True"):
        CompressConfig(virtual_offset=True).validate()
    saved = CompressConfig(share_scores="readout", verbatim_share=0.0, proportional_attention=True).validate().to_dict()
    for key in ("share_scores", "verbatim_share", "virtual_offset"):  # a recipe saved before the setting existed
        del saved[key]
    old = CompressConfig.from_dict(saved)
    assert (old.share_scores, old.verbatim_share, old.proportional_attention, old.virtual_offset) == (
        "readout",
        0.0,
        True,
        0.0,
    )


def test_per_head_hybrid_per_turn_ranks_each_turn_by_its_reconstruction_pass_on_the_running_cache(evaluation):
    """Turn by turn (vkv compress --per-turn, sessions, the sequential method), each turn's verbatim entries are the
    best by the reconstruction pass read out on top of the running compressed cache, and every turn records its loss."""
    work = evaluation.work
    turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
    compress = CompressConfig(
        head_budget="uniform", verbatim_share=0.5, verbatim_source="kvzip", oversample=2.0, optim=OptimConfig(steps=1)
    )
    config = VkvRecipe(compress=compress, target_source="online").validate()
    history = FullHistory(work.acts, work.kv)
    budget = work.budget(3.0)
    segments = compress_virtual_turns(
        work.lm, work.ids, turns, work.prefix_cache(), config, budget, history, work.message_starts
    )
    running = work.prefix_cache()
    for turn, segment, entries in zip(turns, segments, allocate([t.length for t in turns], budget)):
        view = TurnWork.on_cache(work, running, turn)
        scores = ReconstructionPass.run(view, 2048, score=True).scores
        verbatim = reached(*per_head_index(scores, HeadSplit.of(entries, 0.5).verbatim, "uniform"), turn.length)
        keys, _ = view.span_kv()
        assert segment.kind == "compact" and segment.real_entries == pytest.approx(entries)
        for layer in range(verbatim.shape[0]):
            for head in range(verbatim.shape[1]):
                held = segment.keys[layer, head][torch.isfinite(segment.bias[layer, head])]  # [reached, head_dim]
                own = (held[None] == keys[layer, head][:, None]).all(-1).any(-1)  # [turn tokens]: held as they are
                assert torch.equal(own, verbatim[layer, head])
        assert segment.stats["loss"] >= 0 and len(segment.stats["per_layer_v_loss"]) == work.lm.spec.num_layers
        running.append(segment)


def test_turn_level_hybrid_ranks_its_virtual_tokens_by_the_reconstruction_pass(evaluation):
    """The hybrid that keeps tokens for every head gives each head the virtual tokens whose blocks (over the tokens it
    did not keep) hold the tokens KVzip ranks best in that head."""
    work = evaluation.work
    recipe = HybridRecipe(head_budget="uniform", oversample=2.0, optim=OptimConfig(steps=1))
    segment = get_method("vkv", recipe=VkvRecipe(recipe, verbatim="shared")).compress(work, 3.0)
    share = verbatim_share(work.span_length, work.budget(3.0), HybridConfig())
    kept = choose_verbatim(work.acts, share, HybridConfig())
    rest = torch.tensor([i for i in range(work.span_length) if i not in set(kept.tolist())])
    scores = ReconstructionPass.run(work, 2048, score=True).scores
    k = recipe.virtual_tokens(share.virtual, len(rest))
    problem = SpanProblem.build(
        work.lm, work.ids, work.acts, k, recipe.validate(), work.message_starts, tokens=rest, token_scores=scores
    )
    best = problem.blocks.most(scores[:, :, rest]).topk(share.virtual, dim=-1).indices
    virtual = torch.ones(segment.slots, dtype=torch.bool)
    virtual[segment.stats["verbatim_entries"]] = False
    reach = torch.isfinite(segment.bias[:, :, virtual])
    assert torch.equal(reach, torch.zeros_like(reach).scatter_(-1, best, True))
