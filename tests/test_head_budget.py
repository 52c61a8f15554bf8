"""Head-wise budgets (uniform, AdaKV's adaptive split, padding masked by −inf) and every budget method per turn."""

from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tests.conftest import FIXTURES
from vkv.compress.config import CompressConfig
from vkv.compress.head_budget import ADAKV_SAFEGUARD, mask_per_head, per_head_index
from vkv.compress.head_hybrid import HeadSplit, reached
from vkv.compress.optimise import OptimConfig
from vkv.compress.pooling import Blocks
from vkv.compress.problem import SpanProblem
from vkv.compress.reconstruction import ReconstructionPass
from vkv.compress.sequential import message_turns
from vkv.compress.single import compress_span
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.file import read_header, save_cache
from vkv.kv.report import entries_text, report_rows
from vkv.kv.segment import verbatim_segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.context import Context
from vkv.lm.rebuild import load_cache
from vkv.methods import get_method
from vkv.methods.work import SpanWork, TurnWork
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
    assert main([*argv, "--num-queries", "many"]) == 2
    assert "argument --num-queries: expected int, got 'many'" in capsys.readouterr().err


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
    recipe = CompressConfig(head_budget=rule, oversample=2.0, optim=OptimConfig(steps=1))
    segment = get_method("vkv", recipe=recipe).compress(work, 3.0)
    budget = work.budget(3.0)
    assert segment.kind == "virtual" and segment.entries == min(work.span_length, 2 * budget)
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
    assert row["entries"] == pytest.approx(budget) and row["slots"] == segment.entries  # the report counts reach
    assert row["ratio"] == pytest.approx(work.span_length / budget, abs=1e-3)
    assert entries_text(row) == f"{row['entries']:g} of {segment.entries} slots"
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
            "vkv", recipe=CompressConfig(head_budget="adaptive", fit_bias=fit, optim=OptimConfig(steps=1))
        ).compress(work, 3.0)
        for fit in (False, True)
    }
    masked, fitted = segments[False].bias, segments[True].bias
    assert torch.equal(segments[False].keys, segments[True].keys)  # the same embeddings: fitting comes after
    assert torch.equal(fitted.isneginf(), masked.isneginf()) and not torch.allclose(fitted, masked)
    acts, _ = capture_span(work.lm, work.ids[: work.end], work.start, work.end, queries=True)
    config = CompressConfig(head_budget="adaptive", fit_bias=True)
    readout = SpanProblem.build(work.lm, work.ids, acts, segments[True].entries, config).readout

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
        head_budget="uniform", share_scores="reconstruction", oversample=2.0, optim=OptimConfig(steps=1)
    )
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
    with pytest.raises(VkvError, match="share_scores=reconstruction is implemented for one span compressed whole"):
        SpanProblem.build(work.lm, work.ids, work.acts, k, recipe, work.message_starts)  # e.g. per turn, no scores


@pytest.mark.parametrize("rule", ["uniform", "adaptive"])
def test_per_head_hybrid_keeps_each_heads_kvzip_best_verbatim_and_virtual_tokens_for_what_it_dropped(
    evaluation, rule, tmp_path
):
    """verbatim_share: each head reaches its best own entries by KVzip's importance (bias 0, the span's K/V as the
    model computed them) and, for the rest of its budget, the virtual tokens whose blocks hold the most important
    token it dropped, each weighted by the tokens of its block the head does not hold; the ratio counts both."""
    work = evaluation.work
    recipe = CompressConfig(
        head_budget=rule,
        share_scores="reconstruction",
        verbatim_share=0.5,
        oversample=2.0,
        optim=OptimConfig(steps=1),
    )
    budget, n = work.budget(3.0), work.span_length
    split = HeadSplit.of(budget, 0.5)
    segment = get_method("vkv", recipe=recipe).compress(work, 3.0)
    k = recipe.virtual_tokens(split.virtual, n)
    assert segment.kind == "virtual" and segment.entries == n + k
    assert segment.real_entries == pytest.approx(budget)  # verbatim and virtual entries together meet the budget
    scores = ReconstructionPass.run(work, 2048, score=True).scores
    verbatim = reached(*per_head_index(scores, split.verbatim, rule), n)
    keys, values = work.span_kv()
    order = segment.positions.argsort(stable=True)
    assert torch.equal(order, torch.arange(segment.entries))  # entries in position order
    blocks = SpanProblem.build(work.lm, work.ids, work.acts, k, recipe, work.message_starts, token_scores=scores).blocks
    own_slots = torch.tensor([float(p) in set(range(work.start, work.end)) for p in segment.positions.tolist()])
    # own slots: the first slot at each integral span position is the token's own entry (stable order, own first)
    first = torch.zeros(segment.entries, dtype=torch.bool)
    seen = set()
    for i, p in enumerate(segment.positions.tolist()):
        if own_slots[i] and p not in seen:
            seen.add(p)
            first[i] = True
    assert int(first.sum()) == n
    torch.testing.assert_close(segment.keys[:, :, first], keys)
    torch.testing.assert_close(segment.values[:, :, first], values)
    own_bias, virtual_bias = segment.bias[:, :, first], segment.bias[:, :, ~first]
    assert torch.equal(torch.isfinite(own_bias), verbatim) and bool((own_bias[verbatim] == 0).all())
    left = scores.masked_fill(verbatim, float("-inf"))
    wanted = reached(*per_head_index(blocks.most(left), split.virtual, rule), blocks.count)
    assert torch.equal(torch.isfinite(virtual_bias), wanted)
    block = torch.repeat_interleave(torch.arange(blocks.count), blocks.sizes().long())
    dropped = torch.zeros(*verbatim.shape[:2], blocks.count).index_add_(-1, block, (~verbatim).float())
    torch.testing.assert_close(virtual_bias[wanted], dropped.log()[wanted])
    result = evaluation.evaluate(get_method("vkv", recipe=recipe), 3.0)
    assert result["compressed_entries"] == pytest.approx(budget) and result["ratio_memory"] > 2.0
    spliced = compress_span(work.lm, work.ids, work.start, work.end, 3.0, recipe, work.message_starts)
    (virtual,) = [s for s in spliced.segments if s.kind == "virtual"]  # `vkv compress` keeps the same entries
    assert torch.equal(torch.isfinite(virtual.bias), torch.isfinite(segment.bias))
    assert torch.equal(torch.tensor(virtual.stats["verbatim_entries"]), first.nonzero()[:, 0])
    spliced.meta.update({"fingerprint": work.lm.fingerprint, "spec": work.lm.spec.to_dict()})
    with pytest.raises(VkvError, match="cannot be rebuilt from embeddings; save it with store kv"):
        save_cache(spliced, tmp_path / "e.safetensors", store="embeddings", ids=work.ids)  # own K/V saw the span
    save_cache(spliced, tmp_path / "k.safetensors")  # a K/V file keeps what the heads reach, bit for bit
    reloaded = load_cache(tmp_path / "k.safetensors", work.lm)
    (back,) = [s for s in reloaded.segments if s.kind == "virtual"]
    reach = torch.isfinite(virtual.bias)
    assert torch.equal(back.bias, virtual.bias) and torch.equal(back.keys[reach], virtual.keys[reach])


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"verbatim_share": 0.5},
            "field verbatim_share: each head's verbatim entries are chosen by the reconstruction",
        ),
        ({"verbatim_share": 1.0, "share_scores": "reconstruction"}, "field verbatim_share: must be a fraction"),
        (
            {"verbatim_share": 0.5, "share_scores": "reconstruction", "fit_bias": True},
            "field verbatim_share: fit_bias and the distillation stage are not implemented",
        ),
    ],
)
def test_per_head_hybrid_refuses_what_it_does_not_implement(options, message):
    with pytest.raises(VkvError, match=message):
        CompressConfig(**options).validate()
