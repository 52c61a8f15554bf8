"""Attention matching fitted in batches on the model's device (normal equations accumulated a chunk at a time)
against the row-by-row float64 solvers it replaced (tests/fixtures/am-tiny-reference.safetensors, written by
scripts/am_fixture.py): the same entries per head, and the same biases and values up to summation order."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.am_fixture_cases import CASES, tiny_work
from tests.conftest import FIXTURES
from vkv.compress.attention_matching import AttentionMatchingFit
from vkv.compress.budget import span_budget
from vkv.compress.compaction import row_groups


@pytest.fixture(scope="module")
def work(smol_tokenizer):
    return tiny_work(smol_tokenizer)


@pytest.mark.parametrize("case", list(CASES))
def test_the_batched_fit_reproduces_the_float64_row_by_row_one(work, case):
    stored = load_file(str(FIXTURES / "am-tiny-reference.safetensors"))
    torch.manual_seed(0)
    result, _ = AttentionMatchingFit(**CASES[case]).compaction(work, span_budget(work.span_length, 8.0))
    real = stored[f"{case}.real"]
    assert torch.equal(result.real, real)
    assert torch.equal(result.index[real], stored[f"{case}.index"][real])
    # the least-squares designs of a random model are ill-conditioned: summation order moves a few solutions
    torch.testing.assert_close(result.bias[real], stored[f"{case}.bias"][real], rtol=1e-2, atol=1e-2)
    values = stored[f"{case}.values"][real]
    torch.testing.assert_close(result.values[real], values, rtol=1e-2, atol=1e-2 * float(values.abs().mean()))


def test_rows_are_grouped_by_width_within_the_memory_limit_and_no_more_than_twice_their_need():
    widths = [3, 40, 5, 38, 1, 39, 4, 100]
    groups = row_groups(widths, limit=3 * 40**2)
    assert sorted(r for g in groups for r in g) == list(range(len(widths)))
    assert groups[0] == [7]  # the widest alone: a second row would more than double what the group needs
    assert groups[1] == [1, 5, 3]  # 40, 39, 38 share a width; a fourth row would pass the limit
    for group in groups:
        widest = max(widths[r] for r in group) ** 2
        assert len(group) * widest <= max(widest, min(3 * 40**2, 2 * sum(widths[r] ** 2 for r in group)))
