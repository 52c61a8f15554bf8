"""kvopt: KVzip's entries per head, their keys, values and biases then optimised on the read-out (an upper bound in
KV space)."""

import dataclasses
import math

import pytest
import torch

from tests.conftest import FIXTURES, random_readout
from vkv.compress.compaction import SpanReadout
from vkv.compress.distill import DistillConfig, build_probes, probe_loss
from vkv.compress.kvopt import optimise_entries
from vkv.compress.reference_queries import reference_queries
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.prefix import KVPrefix
from vkv.methods import get_method
from vkv.text.transcript import load_transcript

CHUNK = 64  # the reconstruction pass in chunks, as the other tests run it


def _readout(seed=0, m=48, n=12, dim=8):
    return random_readout(seed, m=m, n=n, dim=dim)


def read_out_loss(readout: SpanReadout, keys, values, bias, kv_heads: int) -> torch.Tensor:
    """The objective by its definition, per row `[R]`: mean over queries of the read-out's squared error over the
    layer's value variance (mean over D) plus the squared log-normaliser error."""
    scores = readout.queries @ keys.transpose(1, 2) + bias[:, None, :]
    variance = readout.values.reshape(-1, kv_heads * readout.values[0].numel()).var(-1).repeat_interleave(kv_heads)
    output = (scores.softmax(-1) @ values - readout.outputs()).pow(2).mean(-1) / variance[:, None]
    return (output + (scores.logsumexp(-1) - readout.log_mass()).pow(2)).mean(-1)


@pytest.mark.parametrize("start", ["keep", "fit"])
def test_keeping_every_entry_reads_the_span_exactly_and_adam_steps_cannot_make_it_worse(start):
    readout = _readout()
    rows, n, _ = readout.keys.shape
    index, real = torch.arange(n).expand(rows, -1), torch.ones(rows, n, dtype=torch.bool)
    exact = optimise_entries(readout, index, real, kv_heads=2, init=start, steps=0)
    assert exact.start_loss.max() < 1e-8 and torch.equal(exact.loss, exact.start_loss)
    torch.testing.assert_close(read_out_loss(readout, exact.keys, exact.values, exact.bias, 2), exact.loss)
    # Adam normalises its steps: from a (near) zero gradient it still moves every coordinate by about lr, which
    # raises the loss; the best iterate is the start.
    stepped = optimise_entries(readout, index, real, kv_heads=2, init=start, steps=5)
    assert torch.equal(stepped.keys, exact.keys) and torch.equal(stepped.values, exact.values)
    assert torch.equal(stepped.loss, exact.loss)


def test_the_descent_lowers_every_rows_loss_and_leaves_padding_masked_and_untouched():
    readout = _readout(1, n=30)
    rows, n, _ = readout.keys.shape
    index = torch.stack(
        [torch.randperm(n, generator=torch.Generator().manual_seed(r))[:8].sort().values for r in range(rows)]
    )
    real = torch.ones(rows, 8, dtype=torch.bool)
    real[1, 5:] = real[2, 7:] = False  # a head-wise budget: rows 1 and 2 reach fewer entries, padded
    index = torch.where(real, index, index[:, :1])
    trace = []
    free = optimise_entries(
        readout, index, real, kv_heads=2, init="keep", steps=40, lr=5e-2, on_step=lambda s, x: trace.append((s, x))
    )
    assert free.keys.shape == (rows, 8, readout.keys.shape[-1]) and free.bias.shape == (rows, 8)
    assert free.bias[~real].isneginf().all() and free.bias[real].isfinite().all()
    kept_keys = readout.keys.gather(1, index[..., None].expand(-1, -1, readout.keys.shape[-1]))
    kept_values = readout.values.gather(1, index[..., None].expand(-1, -1, readout.values.shape[-1]))
    assert torch.equal(free.keys[~real], kept_keys[~real]) and torch.equal(free.values[~real], kept_values[~real])
    assert not torch.equal(free.keys[real], kept_keys[real])  # the real ones moved
    assert (free.loss < 0.5 * free.start_loss).all()
    torch.testing.assert_close(read_out_loss(readout, free.keys, free.values, free.bias, 2), free.loss)
    assert [s for s, _ in trace] == list(range(41)) and trace[0][1] == pytest.approx(float(free.start_loss.mean()))
    again = optimise_entries(readout, index, real, kv_heads=2, init="keep", steps=40, lr=5e-2)
    assert torch.equal(again.keys, free.keys) and torch.equal(again.bias, free.bias)  # deterministic
    with pytest.raises(ValueError, match="unknown init 'mean'"):
        optimise_entries(readout, index, real, kv_heads=2, init="mean")


@pytest.fixture(scope="module")
def evaluation(tiny_llama):
    return TranscriptEval(
        tiny_llama, load_transcript(FIXTURES / "mini-agent.json"), settings=EvalSettings(max_new_tokens=2)
    )


@pytest.fixture(scope="module")
def segments(evaluation):
    """kvzip's segment and kvopt's, from each start with no step and with the default steps, at 3x."""
    work = evaluation.work
    kvopt_budget = get_method("kvopt").head_budget  # kvopt starts from kvzip's choice under its own split
    out = {"kvzip": get_method("kvzip", chunk=CHUNK, head_budget=kvopt_budget).compress(work, 3.0)}
    for start in ("keep", "fit"):
        for steps in (0, 100):
            kvopt = get_method("kvopt", chunk=CHUNK, start=start, adam_steps=steps, distill_steps=0)  # the fit alone
            out[start, steps] = kvopt.compress(work, 3.0)
    return out


def test_no_step_from_the_kept_entries_is_kvzip(segments):
    kvzip, kept = segments["kvzip"], segments["keep", 0]
    assert kept.kind == kvzip.kind == "compact"
    for field in ("keys", "values", "positions", "bias"):
        assert torch.equal(getattr(kept, field), getattr(kvzip, field)), field
    assert kept.stats["steps"] == 0 and kept.stats["best_loss"] == kept.stats["initial_loss"]


def test_the_optimised_entries_read_the_span_better_than_their_start(evaluation, segments):
    work = evaluation.work
    keys, values = work.span_kv()
    layers, kv_heads, _, dim = keys.shape
    queries = reference_queries(work, "repeat", get_method("kvopt").max_queries, CHUNK)
    readout = SpanReadout.per_head(queries, keys, values)
    rows = layers * kv_heads

    def loss(segment):  # recomputed from what the segment stores, not taken from its stats
        flat = (segment.keys.reshape(rows, -1, dim), segment.values.reshape(rows, -1, dim))
        return float(read_out_loss(readout, *flat, segment.bias.reshape(rows, -1), kv_heads).mean())

    for start in ("keep", "fit"):
        before, after = segments[start, 0], segments[start, 100]
        assert after.stats["initial_loss"] == pytest.approx(loss(before), rel=1e-4)
        assert after.stats["best_loss"] == pytest.approx(loss(after), rel=1e-3, abs=1e-9)
        assert loss(after) < 0.5 * loss(before)
    assert loss(segments["fit", 0]) < 0.01 * loss(segments["keep", 0])  # attention matching's fit is a far better start
    # the optimised keys are free: no longer the span's own
    distances = (segments["fit", 100].keys[0, 0][:, None] - keys[0, 0][None]).abs().amax(-1)
    assert distances.min(dim=1).values.max() > 0


def test_padding_stays_masked_and_the_budget_is_kvzips(evaluation, segments):
    work, kvzip = evaluation.work, segments["kvzip"]
    for key in (("keep", 100), ("fit", 100)):
        segment = segments[key]
        padding = segment.bias.isneginf()
        assert torch.equal(padding, kvzip.bias.isneginf()) and bool(padding.any())  # the global split pads some heads
        assert segment.bias[~padding].isfinite().all()
        assert segment.slots == kvzip.slots and segment.real_entries == pytest.approx(kvzip.real_entries)
        assert segment.real_entries == pytest.approx(work.budget(3.0))
        assert torch.equal(segment.positions, kvzip.positions)
    result = evaluation.evaluate(get_method("kvopt", chunk=CHUNK, start="keep", adam_steps=10, distill_steps=0), 3.0)
    assert result["ratio_achieved"] == pytest.approx(work.span_length / work.budget(3.0), rel=1e-3)
    assert result["optimisation"]["best_loss"] < result["optimisation"]["initial_loss"]


def test_the_end_to_end_stage_lowers_the_repeat_kl_of_the_entries_it_stores_or_keeps_its_start(evaluation):
    """kvopt's second stage moves the free entries toward the model's own re-reading of the span: the KL over the
    repeat probe, recomputed from what each segment stores, falls from kvzip's entries to the tuned ones; a stage
    whose steps raise it (too large a learning rate) returns its start."""
    work, lm = evaluation.work, evaluation.work.lm
    kept = get_method("kvopt", chunk=CHUNK, start="keep", adam_steps=0, distill_steps=0)
    stage = {"distill_steps": 4, "distill_probe_tokens": 16, "distill_step_tokens": 32}
    before = kept.compress(work, 6.0)
    after = dataclasses.replace(kept, **stage, distill_lr=1e-3).compress(work, 6.0)
    overshot = dataclasses.replace(kept, **stage, distill_lr=1.0).compress(work, 6.0)
    config = DistillConfig(probes=("repeat",), probe_tokens=16)
    probes = build_probes(lm, work.ids, work.end, work.kv, config, work.start)

    def kl(segment):
        held = KVPrefix(
            [k[None] for k in segment.keys], [v[None] for v in segment.values], None, [b[None] for b in segment.bias]
        )
        with torch.no_grad():
            return float(probe_loss(lm, work.prefix().cat(held), work.end, probes))

    stats = after.stats["distill"]
    assert len(stats["probe_tokens"]) > 1  # the probes were taken in turn, as the default step budget does
    assert kl(before) == pytest.approx(stats["initial_kl"], rel=1e-3)
    assert kl(after) == pytest.approx(stats["final_kl"], rel=1e-3) and kl(after) < 0.9 * kl(before)
    assert torch.equal(after.bias.isneginf(), before.bias.isneginf())  # padding stays masked
    assert torch.equal(after.positions, before.positions) and "distill" not in before.stats
    assert overshot.stats["distill"]["final_kl"] > overshot.stats["distill"]["initial_kl"]
    for field in ("keys", "values", "bias"):
        assert torch.equal(getattr(overshot, field), getattr(before, field)), field


def test_the_end_to_end_stage_per_turn_reads_the_running_history(evaluation):
    """Per turn, the teacher is what the model holds before the turn is compressed (the compressed history and the
    turn): every turn runs its stage from a finite KL, and keeps the best of its steps."""
    method = get_method("kvopt", chunk=CHUNK, adam_steps=1, per_turn=True, distill_steps=2, distill_probe_tokens=16)
    group = method.compress(evaluation.work, 3.0)
    stages = [s.stats["distill"] for s in group if "distill" in s.stats]
    assert len(stages) == len(group) > 1
    for stage in stages:
        assert math.isfinite(stage["initial_kl"]) and stage["best_kl"] <= stage["initial_kl"]
