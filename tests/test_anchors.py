"""Attention matching (closed-form compaction) and KVzip-style reconstruction scores."""

import time
from dataclasses import replace

import pytest
import torch

from tests.conftest import FIXTURES, random_readout
from vkv.compress.compaction import SpanReadout, compact, fit_bias
from vkv.compress.nnls import nnls, solve_spd
from vkv.compress.reconstruction import (
    REPEAT_REQUEST,
    SINKS,
    TEMPLATE_REQUEST,
    ReconstructionPass,
    assistant_header,
)
from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.file import save_cache
from vkv.kv.spliced import SplicedCache
from vkv.lm.attention import query_hooks
from vkv.lm.rebuild import load_cache
from vkv.methods import get_method
from vkv.text.transcript import load_transcript


def _readout(seed=0, **shape):
    return random_readout(seed, **shape)


@pytest.mark.parametrize("selection", ["rms", "mean", "omp"])
def test_keeping_every_entry_reproduces_read_outs_and_masses(selection):
    readout = _readout()
    full = compact(readout, readout.keys.shape[1], selection)
    torch.testing.assert_close(full.outputs(readout.queries, readout), readout.outputs(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(full.log_mass(readout.queries, readout), readout.log_mass(), atol=1e-4, rtol=1e-4)
    assert full.bias.abs().max() < 1e-4  # every weight 1


def test_nnls_is_non_negative_and_fitted_biases_keep_the_mass_better():
    readout = _readout(1)
    p = readout.attention()[:, :, :12]
    w = nnls(p)
    assert (w >= 0).all()
    errors = {
        b: (compact(readout, 10, bias=b).log_mass(readout.queries, readout) - readout.log_mass()).abs().mean()
        for b in ("fit", "shared", "none")
    }
    assert errors["fit"] < errors["shared"] < errors["none"]


def test_refitted_values_read_better_on_held_back_queries():
    readout = _readout(2, m=192)
    fit = SpanReadout(readout.queries[:, ::2], readout.keys, readout.values)
    held = readout.queries[:, 1::2]
    truth = SpanReadout(held, readout.keys, readout.values).outputs()
    error = {v: (compact(fit, 10, values=v).outputs(held, readout) - truth).pow(2).mean() for v in ("refit", "keep")}
    assert error["refit"] < error["keep"]


def test_the_ridge_solve_is_right_with_several_cpu_threads():
    """A batch of systems the size am solves on a 1k-token span at 8x (90 rows of about 200 slots): with two threads,
    MKL's batched LU (torch.linalg.solve) returned garbage or failed here; the Cholesky solve matches float64."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(90, 198, 198, generator=g)
    a = a @ a.transpose(1, 2) / 198 + 0.1 * torch.eye(198)
    b = torch.randn(90, 198, 64, generator=g)
    exact = torch.linalg.solve(a.double(), b.double())
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        x = solve_spd(a, b)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(x.double(), exact, rtol=1e-3, atol=1e-3)


def test_omp_keeps_the_mass_better_than_top_attention():
    readout = _readout(3)
    mass = {
        s: (compact(readout, 8, s).log_mass(readout.queries, readout) - readout.log_mass()).abs().mean()
        for s in ("rms", "omp")
    }
    assert mass["omp"] < mass["rms"]


@pytest.fixture(scope="module")
def evaluation(tiny_llama):
    return TranscriptEval(
        tiny_llama, load_transcript(FIXTURES / "mini-agent.json"), settings=EvalSettings(max_new_tokens=2)
    )


@pytest.mark.parametrize(
    "name, options",
    [
        ("am", {}),
        ("am", {"selection": "omp", "queries": "repeat+span", "head_budget": "uniform", "on_policy": False}),
        ("am", {"queries": "span", "head_budget": "adaptive", "bias": "fit", "ridge": 1e-2}),
        ("kvzip", {}),
        ("kvzip", {"head_budget": "shared"}),
    ],
)
def test_methods_meet_the_budget_and_survive_a_file(evaluation, tmp_path, name, options):
    work = evaluation.work
    segment = get_method(name, **options).compress(work, 3.0)
    layers, kv_heads = work.lm.spec.num_layers, work.lm.spec.num_kv_heads
    assert segment.keys.shape[:2] == (layers, kv_heads) and segment.slots >= work.budget(3.0)
    assert segment.real_entries == pytest.approx(work.budget(3.0))  # adaptive budgets pad; the pads are unreachable
    keys, _ = work.span_kv()
    for layer in range(layers):  # every kept key is one of the span's own, in its own head
        for head in range(kv_heads):
            distances = (segment.keys[layer, head][:, None] - keys[layer, head][None]).abs().amax(-1)
            assert distances.min(dim=1).values.max() == 0
    spliced = SplicedCache(meta={"fingerprint": work.lm.fingerprint, "spec": work.lm.spec.to_dict()})
    spliced.append(segment)
    save_cache(spliced, tmp_path / "c.safetensors")
    loaded = load_cache(tmp_path / "c.safetensors", work.lm).segments[0]
    assert torch.equal(loaded.keys, segment.keys) and torch.equal(loaded.values, segment.values)
    assert (loaded.bias is None) == (segment.bias is None) and loaded.kind == segment.kind
    result = evaluation.evaluate(get_method(name, **options), 3.0)
    assert result["ratio_achieved"] == pytest.approx(work.span_length / work.budget(3.0), rel=1e-3)
    assert result["stored_entries"] == segment.slots  # the padded slots a per-byte comparison must count


def test_am_with_every_entry_answers_as_the_full_context_does(evaluation):
    work = evaluation.work
    segment = get_method("am").compress(work, 1.0)
    full = evaluation.splice(work.keep(list(range(work.span_length))))
    compacted = evaluation.splice(segment)
    probe = evaluation.questions[0].prompt
    from vkv.lm.context import Context

    torch.testing.assert_close(
        Context(work.lm, compacted).feed(probe), Context(work.lm, full).feed(probe), atol=2e-3, rtol=1e-3
    )


def test_nearest_mass_counts_each_dropped_token_once():
    from vkv.methods.eviction import nearest_mass

    assert nearest_mass(torch.tensor([0, 4, 9]), 10).tolist() == [3.0, 4.0, 3.0]  # 0-2 | 3-6 | 7-9 (2: a tie, earlier)
    assert nearest_mass(torch.arange(10), 10).tolist() == [1.0] * 10


@pytest.mark.parametrize("name", ["knorm", "truncate"])
def test_eviction_with_nearest_mass_carries_the_dropped_tokens(evaluation, name):
    work = evaluation.work
    plain = get_method(name).compress(work, 3.0)
    massed = get_method(name, mass="nearest").compress(work, 3.0)
    assert torch.equal(plain.keys, massed.keys) and plain.bias is None
    from tests.conftest import shared_mass

    assert int(shared_mass(massed).sum()) == work.span_length and shared_mass(massed).min() >= 1
    result = evaluation.evaluate(get_method(name, mass="nearest"), 3.0)
    assert result["config"]["mass"] == "nearest"


@pytest.mark.parametrize("kind, heads", [("am", "shared"), ("am-per-head", "uniform")])
def test_am_targets_are_the_compacted_entries_and_start_from_kept_tokens(evaluation, kind, heads):
    from vkv.compress.pooling import block_weights, partition
    from vkv.compress.targets import build_targets, compaction_targets
    from vkv.lm.capture import capture_span

    work = evaluation.work
    acts, _ = capture_span(work.lm, work.ids[: work.end], work.start, work.end, queries=True)
    k = work.budget(3.0)
    blocks = partition(work.span_length, k)
    targets = build_targets(
        work.lm, torch.tensor(work.ids), acts, blocks, block_weights("uniform", blocks, acts.surprisal), kind
    )
    keys, values, kept = compaction_targets(work.lm, acts, k, heads)
    assert torch.equal(targets.keys, keys) and torch.equal(targets.values, values)
    assert targets.keys.shape == (work.lm.spec.num_layers, work.lm.spec.num_kv_heads, k, work.lm.spec.head_dim)
    span_keys, _ = work.span_kv()  # every target key is one of the span's own, as the model cached it
    assert torch.allclose(keys[0, 0, 0], span_keys[0, 0, kept[0]], atol=1e-4) or heads == "uniform"
    embeddings = work.lm.embed(torch.tensor(work.ids[work.start : work.end])).float()
    assert torch.equal(targets.pooled_embeddings, embeddings[kept])


def test_fit_bias_for_the_spans_own_keys_is_zero_and_for_fewer_keys_beats_its_start():
    readout = _readout(4)
    rows, n = readout.keys.shape[:2]
    own = fit_bias(readout.queries, readout.log_mass(), readout.keys, torch.zeros(rows, n))
    assert own.abs().max() < 1e-4  # every weight 1 already matches the mass exactly
    keys = readout.keys[:, ::4]  # 10 entries for 40: log(4) each is the proportional-attention start
    start = torch.full(keys.shape[:2], 4.0).log()

    def error(beta):
        mass = (readout.queries @ keys.transpose(1, 2) + beta[:, None, :]).logsumexp(-1)
        return (mass.exp() / readout.log_mass().exp() - 1).pow(2).sum()

    fitted = fit_bias(readout.queries, readout.log_mass(), keys, start)
    assert fitted.shape == start.shape and fitted.isfinite().all()
    assert error(fitted) < 0.5 * error(start)
    masked = start.clone()
    masked[:, ::3] = float("-inf")  # a head-wise mask: those entries stay out, the others are fitted without them
    refitted = fit_bias(readout.queries, readout.log_mass(), keys, masked)
    assert refitted[:, ::3].isneginf().all() and refitted[masked.isfinite()].isfinite().all()
    assert error(refitted) < error(masked)
    keep = masked[0].isfinite()  # the same fit as for the kept keys alone
    alone = fit_bias(readout.queries, readout.log_mass(), keys[:, keep], start[:, keep])
    torch.testing.assert_close(refitted[:, keep], alone)


def test_a_reconstruction_pass_past_the_models_positions_is_refused_saying_what_fits(evaluation, monkeypatch):
    work = replace(evaluation.work)  # nothing reused from runs at the model's real positions
    monkeypatch.setattr(work.lm.model.config, "max_position_embeddings", work.end + 20)  # room for no chunk
    with pytest.raises(
        VkvError,
        match=r"reads the span's \d+ tokens out again after it, in chunks of at least 64: reaches position "
        r".*spans of up to \d+ tokens fit",
    ):
        get_method("kvzip").compress(work, 2.0)


def read_out_scores_in_one_forward(work) -> torch.Tensor:
    """KVzip's scores by the plain definition: one forward over the context, the request and the span again; each span
    entry's largest attention from any query of the repeated span, over the query heads sharing its KV head."""
    lm = work.lm
    request = lm.tokenizer(REPEAT_REQUEST, add_special_tokens=False)["input_ids"]
    ids = list(work.ids[: work.end]) + request + list(work.ids[work.start : work.end])
    first = work.end + len(request)
    cache = lm.new_cache()
    with torch.no_grad(), query_hooks(lm, first, len(ids)) as queries:
        lm.decoder(torch.tensor([ids]), cache)
    group = lm.spec.num_heads // lm.spec.num_kv_heads
    out = []
    for q, layer in zip(queries, cache.layers):
        q = lm.rotate(q.float(), torch.arange(first, len(ids)))
        k = layer.keys[0].float().repeat_interleave(group, dim=0)
        scores = (q @ k.transpose(1, 2) * lm.spec.head_dim**-0.5).masked_fill(
            torch.arange(len(ids))[None, :] > torch.arange(first, len(ids))[:, None], float("-inf")
        )
        probs = scores.softmax(-1)[:, :, work.start : work.end].amax(1)
        out.append(probs.reshape(lm.spec.num_kv_heads, group, -1).amax(1))
    return torch.stack(out)


def test_the_reconstruction_pass_on_the_spans_own_kv_scores_as_one_forward_over_the_span_read_out_again(evaluation):
    work = evaluation.work
    expected = read_out_scores_in_one_forward(work)
    torch.testing.assert_close(
        ReconstructionPass.run(work, chunk=2048, score=True).scores, expected, atol=1e-5, rtol=1e-4
    )


def test_the_reference_normalisation_scores_as_kvzips_code_defines_it(evaluation):
    """KVzip's reference: the request closed by the template's assistant header, every fed query counted, and the
    softmax over the sequence's first 4 entries, the span and the read-out only."""
    work = evaluation.work
    lm = work.lm
    request = lm.tokenizer.encode(TEMPLATE_REQUEST + assistant_header(lm.tokenizer), add_special_tokens=False)
    ids = list(work.ids[: work.end]) + request + list(work.ids[work.start : work.end])
    cache = lm.new_cache()
    with torch.no_grad(), query_hooks(lm, work.end, len(ids)) as queries:
        lm.decoder(torch.tensor([ids]), cache)
    group = lm.spec.num_heads // lm.spec.num_kv_heads
    column, rows = torch.arange(len(ids)), torch.arange(work.end, len(ids))
    seen = (column < SINKS) | ((column >= work.start) & (column < work.end)) | (column >= work.end)
    expected = []
    for q, layer in zip(queries, cache.layers):
        q = lm.rotate(q.float(), rows)
        k = layer.keys[0].float().repeat_interleave(group, dim=0)
        scores = (q @ k.transpose(1, 2) * lm.spec.head_dim**-0.5).masked_fill(
            (column[None, :] > rows[:, None]) | ~seen[None, :], float("-inf")
        )
        probs = scores.softmax(-1)[:, :, work.start : work.end].amax(1)
        expected.append(probs.reshape(lm.spec.num_kv_heads, group, -1).amax(1))
    scores = ReconstructionPass.run(work, chunk=2048, score=True, normalise="chunk").scores
    torch.testing.assert_close(scores, torch.stack(expected), atol=1e-5, rtol=1e-4)
    assert not torch.allclose(scores, ReconstructionPass.run(work, chunk=2048, score=True).scores, rtol=0.01, atol=0)


def test_a_span_too_long_to_read_out_twice_is_read_out_in_chunks_within_the_models_positions(evaluation, monkeypatch):
    work = replace(evaluation.work)  # nothing reused from runs at the model's real positions
    span = work.end - work.start
    whole = ReconstructionPass.run(work, chunk=span, score=True)
    assert torch.equal(whole.scores, ReconstructionPass.run(work, chunk=4 * span, score=True).scores)
    monkeypatch.setattr(work.lm.model.config, "max_position_embeddings", work.end + span // 2 + 40)
    chunked = ReconstructionPass.run(work, chunk=4 * span, score=True)  # positions force chunks shorter than asked
    assert chunked.positions.max() < work.lm.max_positions
    assert chunked.queries.shape == whole.queries.shape and chunked.scores.shape == whole.scores.shape
    assert chunked.scores.isfinite().all() and (chunked.scores > 0).all()
    first = chunked.positions[1:] - chunked.positions[:-1] != 1
    assert int(first.sum()) >= 1  # at least two chunks, each read after its own request
    reference = ReconstructionPass.run(work, chunk=4 * span, score=True, normalise="chunk")
    assert reference.queries.shape == chunked.queries.shape  # every span token read out once, in chunks
    assert reference.scores.isfinite().all() and (reference.scores > 0).all()
    segment = get_method("kvzip", chunk=64).compress(work, 2.0)  # end to end, and within the positions
    reached = segment.bias.isfinite().sum()  # one budget over every layer and head (KVzip's split)
    assert reached == work.budget(2.0) * segment.keys.shape[0] * segment.keys.shape[1]


@pytest.mark.parametrize(
    "name, options, expensive",
    [
        ("kvzip", {}, (ReconstructionPass, "run")),
        ("am", {"queries": "repeat"}, (ReconstructionPass, "run")),
        ("snapkv", {"window": 4}, (SpanWork, "attention_between")),  # a window both budgets hold
    ],
)
def test_runs_at_several_ratios_share_the_ratio_free_work_and_still_count_its_time(
    tiny_llama, monkeypatch, name, options, expensive
):
    owner, attr = expensive
    real, calls = owner.__dict__[attr], []
    function = real.__func__ if isinstance(real, classmethod) else real

    def slow(*args, **kwargs):  # the shared work, made slow enough to show in a run's seconds
        calls.append(attr)
        time.sleep(0.3)
        return function(*args, **kwargs)

    monkeypatch.setattr(owner, attr, classmethod(slow) if isinstance(real, classmethod) else slow)
    transcript = load_transcript(FIXTURES / "mini-agent.json")
    shared, alone = (TranscriptEval(tiny_llama, transcript, settings=EvalSettings(max_new_tokens=2)) for _ in range(2))
    shared.evaluate(get_method(name, **options), 2.0)
    second = shared.evaluate(get_method(name, **options), 3.0)
    assert len(calls) == 1  # the second ratio reused the first's pass
    assert second["seconds"] >= 0.3  # ... and its time still counts what a run at 3x alone would take
    expected = alone.evaluate(get_method(name, **options), 3.0)
    assert second["questions"] == expected["questions"]


def test_kvzip_and_am_on_one_work_share_one_reconstruction_pass(tiny_llama, monkeypatch):
    runs = []
    real = ReconstructionPass.__dict__["run"].__func__
    monkeypatch.setattr(
        ReconstructionPass, "run", classmethod(lambda cls, *a, **k: runs.append(1) or real(cls, *a, **k))
    )
    evaluation = TranscriptEval(
        tiny_llama, load_transcript(FIXTURES / "mini-agent.json"), settings=EvalSettings(max_new_tokens=2)
    )
    evaluation.evaluate(get_method("kvzip"), 2.0)
    evaluation.evaluate(get_method("am", on_policy=False), 2.0)
    assert len(runs) == 1  # am's reference queries are the read-out kvzip scored from
