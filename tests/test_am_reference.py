"""Attention matching against the paper's equations as its reference code applies them: each closed-form step next to
a plain implementation of it here, and the on-policy read-out next to the model's own forward."""

import itertools
import math

import pytest
import torch

from tests.conftest import FIXTURES, random_readout
from vkv.compress import compaction, on_policy
from vkv.compress.compaction import SpanReadout, compact, fit_rows, head_counts, row_stats
from vkv.compress.nnls import bounded_nnls
from vkv.compress.omp import omp_keys
from vkv.compress.reconstruction import ReconstructionPass
from vkv.compress.reference_queries import reference_queries
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.lm.layerwise import LayerwisePass
from vkv.methods import get_method
from vkv.text.transcript import load_transcript

CHUNK = 64


def _row(seed=0, m=96, n=40, dim=8):
    readout = random_readout(seed, m=m, n=n, dim=dim)
    return readout.queries[0].double(), readout.keys[0].double(), readout.values[0].double()


def one_row(q, k, v) -> SpanReadout:
    return SpanReadout(q[None].float(), k[None].float(), v[None].float())


def fit_one(q, k, v, stats, index, ridge):
    """β `[c]` and values `[c, D]` of one row's kept entries `index`, by the batched fit."""
    real = torch.ones(1, len(index), dtype=torch.bool)
    beta, values = fit_rows(one_row(q, k, v), stats, index[None], real, "rms", "nnls", "refit", ridge)
    return beta[0], values[0]


def nnls_one(gram, rhs, low, high, steps):
    return bounded_nnls(gram[None], rhs[None], low, high, steps)[0].double()


def exp_scores(q, k):
    """The reference's design: exp(q·k − the query's largest score over the span) `[m, n]`, and its row sums."""
    s = q @ k.T
    e = (s - s.amax(-1, keepdim=True)).exp()
    return e, e.sum(-1)


def box_least_squares(a, y, low, high):
    """min ‖a w − y‖² over low ≤ w ≤ high by brute force: every coordinate free or at either bound."""
    best, best_loss = None, math.inf
    for pattern in itertools.product((None, low, high), repeat=a.shape[1]):
        free = [i for i, p in enumerate(pattern) if p is None]
        w = torch.tensor([0.0 if p is None else p for p in pattern], dtype=a.dtype)
        if free:
            w[free] = torch.linalg.lstsq(a[:, free], y - a @ w).solution
        if (w >= low - 1e-12).all() and (w <= high + 1e-12).all():
            loss = float((a @ w - y).pow(2).sum())
            if loss < best_loss:
                best, best_loss = w, loss
    return best


def test_bounded_nnls_is_the_references_clamped_least_squares_then_its_projected_gradient_steps():
    q, k, _ = _row()
    e, y = exp_scores(q, k)
    a = e[:, ::8]  # 5 keys for 40: their mass falls short, some weights hit the box
    low, high = math.exp(-3), math.exp(3)
    start = torch.linalg.lstsq(a, y).solution.clamp(low, high)
    torch.testing.assert_close(nnls_one(a.T @ a, a.T @ y, low, high, 0), start)
    step = 1.0 / torch.linalg.matrix_norm(a, 2) ** 2
    direct = start
    for _ in range(2):
        direct = (direct - step * a.T @ (a @ direct - y)).clamp(low, high)
    torch.testing.assert_close(nnls_one(a.T @ a, a.T @ y, low, high, 2), direct, rtol=1e-2, atol=1e-4)
    assert not torch.allclose(direct, start)  # the steps moved it: the check above sees them
    exact = box_least_squares(a, y, low, high)  # many steps reach the box-constrained optimum
    torch.testing.assert_close(nnls_one(a.T @ a, a.T @ y, low, high, 3000), exact, rtol=1e-3, atol=1e-4)


def test_fit_row_biases_and_values_are_the_published_closed_forms():
    q, k, v = _row(1)
    stats = row_stats(one_row(q, k, v))
    index = torch.tensor([2, 9, 17, 23, 31, 38])
    beta, values = fit_one(q, k, v, stats, index, 0.0)
    a, y = exp_scores(q, k)
    w = torch.linalg.lstsq(a[:, index], y).solution.clamp(math.exp(-3), math.exp(3))
    step = 1.0 / torch.linalg.matrix_norm(a[:, index], 2) ** 2
    for _ in range(2):
        w = (w - step * a[:, index].T @ (a[:, index] @ w - y)).clamp(math.exp(-3), math.exp(3))
    torch.testing.assert_close(beta.double(), w.log(), rtol=1e-2, atol=1e-3)
    # values: plain least squares of the compact attention (with the fitted β) onto the span's read-outs
    target = (q @ k.T).softmax(-1) @ v
    x = (q @ k[index].T + beta.double()).softmax(-1)
    torch.testing.assert_close(values.double(), torch.linalg.lstsq(x, target).solution, rtol=1e-3, atol=1e-4)
    # and the ridge option pulls them toward the kept entries' own
    _, pulled = fit_one(q, k, v, stats, index, 10.0)
    assert (pulled - v[index].float()).norm() < (values - v[index].float()).norm()


def test_rms_keys_are_the_highest_root_mean_square_attention(monkeypatch):
    q, k, v = _row(2)
    attention = (q @ k.T).softmax(-1)
    rms = attention.pow(2).mean(0).sqrt()
    monkeypatch.setattr(compaction, "SCORE_ELEMENTS", 7 * k.shape[0])  # chunks of 7 queries
    stats = row_stats(one_row(q, k, v))
    torch.testing.assert_close(stats.rms[0].double(), rms, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(stats.mean[0].double(), attention.mean(0), rtol=1e-4, atol=1e-7)
    readout = SpanReadout(q[None].float(), k[None].float(), v[None].float())
    kept = compact(readout, 7, "rms").index[0]
    assert kept.tolist() == rms.topk(7).indices.sort().values.tolist()
    assert kept.tolist() != attention.mean(0).topk(7).indices.sort().values.tolist()  # this row tells them apart


def reference_omp(q, k, t, low=1e-12, high=1096.6331584284585, drop=-7.0, rounds=3):  # high: e⁷
    """The reference's OMP (one key per pick): exp-score columns, row sums as the target, greedy on the unnormalised
    correlation with the residual, least squares clamped after each pick, low-weight keys dropped and replaced."""
    e, y = exp_scores(q, k)
    chosen, excluded, current, entries = [], set(), torch.zeros_like(y), 0
    while True:
        while len(chosen) < t and len(chosen) + len(excluded) < k.shape[0]:
            correlation = e.T @ (y - current)
            correlation[chosen + sorted(excluded)] = -math.inf
            chosen.append(int(correlation.argmax()))
            w = torch.linalg.lstsq(e[:, chosen], y).solution.clamp(low, high)
            current = e[:, chosen] @ w
        entries += 1
        if entries > rounds:
            break
        w = torch.linalg.lstsq(e[:, chosen], y).solution.clamp(low, high)
        dropped = [c for c, x in zip(chosen, w.log()) if x < drop]
        if not dropped:
            break
        excluded.update(dropped)
        chosen = [c for c in chosen if c not in dropped]
        current = e[:, chosen] @ torch.linalg.lstsq(e[:, chosen], y).solution.clamp(low, high)
    return sorted(chosen)


@pytest.mark.parametrize("seed", [3, 4])
def test_omp_picks_what_the_reference_omp_picks(seed):
    q, k, v = _row(seed, n=60)
    stats = row_stats(one_row(q, k, v)).rows(0)
    picked = omp_keys(q.float(), k.float(), stats.log_max, stats.mass, 12)
    assert picked.tolist() == reference_omp(q, k, 12)
    e, y = exp_scores(q, k)
    top = stats.rms.topk(12).indices
    residual = {
        name: (e[:, idx] @ torch.linalg.lstsq(e[:, idx], y).solution - y).norm()
        for name, idx in (("omp", picked), ("rms", top))
    }
    assert residual["omp"] < residual["rms"]  # what OMP is for: the masses


def test_a_global_budget_spends_the_spans_entries_over_every_head_capped_at_a_share_of_the_span():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(3, 2, 50, generator=g) ** 6
    scores[1, 0] += 1  # one head draws more attention than any other
    counts, _ = head_counts(scores, 10, "global")
    assert int(counts.sum()) == 10 * 6 and int(counts[1, 0]) == 50
    capped, _ = head_counts(scores, 10, "global", 0.75)
    assert int(capped.sum()) == 10 * 6 and int(capped.max()) == 37 and (capped >= 1).all()
    uniform, _ = head_counts(scores, 10, "uniform", 0.75)
    assert (uniform == 10).all()


@pytest.fixture(scope="module")
def work(tiny_llama):
    return TranscriptEval(
        tiny_llama, load_transcript(FIXTURES / "mini-agent.json"), settings=EvalSettings(max_new_tokens=2)
    ).work


def full_context(work, layer):
    """The context the read-out attends to at `layer` with nothing compacted: every entry before the span's end."""
    keys, values = work.kv.keys[layer], work.kv.values[layer]
    return keys, values, torch.zeros(keys.shape[:3])


def test_a_layer_by_layer_pass_over_the_whole_span_reproduces_the_models_own_read_out_queries(work):
    lm = work.lm
    read_out = ReconstructionPass.run(work, CHUNK)
    stack, firsts = on_policy.read_out_pass(work, CHUNK)
    assert len(firsts) > 1  # several chunks, each after its own request
    for layer in range(lm.spec.num_layers):
        layerwise = torch.cat([q[:, first:] for q, first in zip(stack.queries(), firsts)], dim=1)
        expected = lm.rotate(read_out.queries[layer].float(), read_out.positions)
        torch.testing.assert_close(layerwise, expected, atol=1e-4, rtol=1e-4)
        stack.advance(*full_context(work, layer))


def test_on_policy_queries_match_the_plain_read_out_at_layer_zero_and_differ_once_earlier_layers_are_compacted(
    work, monkeypatch
):
    seen = []
    real = on_policy.compact_rows
    monkeypatch.setattr(
        on_policy, "compact_rows", lambda readout, *a, **k: seen.append(readout.queries) or real(readout, *a, **k)
    )
    get_method("am", chunk=CHUNK).compress(work, 16.0)
    plain = reference_queries(work, "repeat", get_method("am").max_queries, CHUNK)
    assert len(seen) == work.lm.spec.num_layers and seen[0].shape == plain[0].shape
    torch.testing.assert_close(seen[0], plain[0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(seen[-1], plain[-1], atol=1e-3, rtol=1e-3)
    seen.clear()
    get_method("am", chunk=CHUNK).compress(work, 1.0)  # nothing dropped: the compacted layers read as the full ones
    torch.testing.assert_close(seen[-1], plain[-1], atol=2e-3, rtol=1e-3)


def test_the_layerwise_pass_refuses_an_architecture_it_cannot_run_one_layer_at_a_time(work, monkeypatch):
    from vkv.errors import VkvError

    monkeypatch.setattr(type(work.lm), "fast_path_supported", property(lambda self: False))
    with pytest.raises(VkvError, match="one layer at a time .* is not implemented"):
        LayerwisePass(work.lm, [[1, 2]], [torch.arange(2)])
