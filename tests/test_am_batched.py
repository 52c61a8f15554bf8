"""Attention matching fitted in batches on the model's device (float32 normal equations accumulated a chunk of queries
at a time, as the reference computes its designs) against the row-by-row float64 solvers it replaced
(tests/fixtures/am-tiny-reference.safetensors, written by scripts/am_fixture.py): the same entries wherever the
selection does not depend on earlier fits, and a read-out of the span about as close as theirs. The tiny random
model's designs are far worse conditioned than a trained model's, so its biases and values move with the precision;
on the test model the two precisions gave the same read-out error (evals/RESULTS.md)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.am_fixture_cases import CASES, tiny_work
from tests.conftest import FIXTURES
from vkv.compress.attention_matching import AttentionMatchingFit
from vkv.compress.budget import span_budget
from vkv.compress.compaction import Compaction, SpanReadout, row_groups
from vkv.compress.reference_queries import reference_queries

FIELDS = ("index", "bias", "values", "real")


@pytest.fixture(scope="module")
def work(smol_tokenizer):
    return tiny_work(smol_tokenizer)


def read_out_errors(compaction: Compaction, readout: SpanReadout) -> tuple[float, float]:
    """(mean relative error of what the queries read, mean |Δ log-mass|) of a compaction against the whole span."""
    truth = readout.outputs()
    out = compaction.outputs(readout.queries, readout)
    relative = ((out - truth).norm(dim=-1) / truth.norm(dim=-1)).mean()
    mass = (compaction.log_mass(readout.queries, readout) - readout.log_mass()).abs().mean()
    return float(relative), float(mass)


@pytest.mark.parametrize("case", list(CASES))
def test_the_batched_fit_reads_the_span_out_as_the_float64_row_by_row_one_did(work, case):
    stored = load_file(str(FIXTURES / "am-tiny-reference.safetensors"))
    before = Compaction(*(stored[f"{case}.{f}"] for f in FIELDS))
    torch.manual_seed(0)
    result, _ = AttentionMatchingFit(**CASES[case]).compaction(work, span_budget(work.span_length, 8.0))
    assert torch.equal(result.real.sum(-1), before.real.sum(-1))  # every head keeps as many entries as before
    if not AttentionMatchingFit(**CASES[case]).live:  # the entries are chosen before any fit: the same ones
        assert torch.equal(result.index[before.real], before.index[before.real])
    keys, values = work.span_kv()
    readout = SpanReadout.per_head(reference_queries(work, "repeat").cpu(), keys, values)
    now, then = read_out_errors(result, readout), read_out_errors(before, readout)
    assert now[0] <= then[0] + 0.01  # what the queries read: within a percent of the span's read-out
    assert now[1] <= then[1] + 0.2  # the span's share of attention, in nats


def test_rows_are_grouped_by_width_within_the_memory_limit_and_no_more_than_twice_their_need():
    widths = [3, 40, 5, 38, 1, 39, 4, 100]
    groups = row_groups(widths, limit=3 * 40**2)
    assert sorted(r for g in groups for r in g) == list(range(len(widths)))
    assert groups[0] == [7]  # the widest alone: a second row would more than double what the group needs
    assert groups[1] == [1, 5, 3]  # 40, 39, 38 share a width; a fourth row would pass the limit
    for group in groups:
        widest = max(widths[r] for r in group) ** 2
        assert len(group) * widest <= max(widest, min(3 * 40**2, 2 * sum(widths[r] ** 2 for r in group)))
