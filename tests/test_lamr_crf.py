"""The CRF's NLL, marginals and Viterbi against brute-force enumeration of every tag path."""

import itertools

import pytest
import torch

from vkv.backends.lamr.crf import LinearChainCRF


def random_crf(seed: int) -> LinearChainCRF:
    torch.manual_seed(seed)
    crf = LinearChainCRF(2).double()
    with torch.no_grad():
        for p in crf.parameters():
            p.normal_()
    return crf


def brute_force(crf, emissions, mask):
    """(log Z, path scores, best path, per-position keep marginals) over the valid positions of one row."""
    with torch.no_grad():
        return _enumerate(crf, emissions, mask)


def _enumerate(crf, emissions, mask):
    valid = [t for t in range(len(mask)) if mask[t]]
    scores = {}
    for path in itertools.product(range(2), repeat=len(valid)):
        s = torch.zeros((), dtype=torch.float64)
        for k, (t, tag) in enumerate(zip(valid, path)):
            s = s + emissions[t, tag] + (crf.start[tag] if k == 0 else crf.transitions[path[k - 1], tag])
        if valid:
            s = s + crf.end[path[-1]]
        scores[path] = s
    stacked = torch.stack(list(scores.values()))
    log_z = torch.logsumexp(stacked, 0) if valid else torch.zeros((), dtype=torch.float64)
    best = max(scores, key=lambda p: float(scores[p]))
    marginal = torch.zeros(len(mask), dtype=torch.float64)
    for path, s in scores.items():
        for t, tag in zip(valid, path):
            marginal[t] += tag * torch.exp(s - log_z)
    return log_z, scores, best, marginal


def random_masks(batch, length, generator):
    masks = torch.rand(batch, length, generator=generator) > 0.35
    masks[0] = True  # a full row
    masks[1] = False  # an empty row
    masks[2, : length // 2] = False  # valid positions only at the end (code after a prompt)
    masks[2, length // 2 :] = True
    return masks


@pytest.mark.parametrize("seed", range(6))
def test_nll_marginals_and_viterbi_match_enumeration(seed):
    crf = random_crf(seed)
    generator = torch.Generator().manual_seed(100 + seed)
    batch, length = 6, 7
    emissions = torch.randn(batch, length, 2, generator=generator, dtype=torch.float64) * 2
    tags = torch.randint(0, 2, (batch, length), generator=generator)
    masks = random_masks(batch, length, generator)
    with torch.no_grad():
        nll = crf.nll(emissions, tags, masks)
        log_z = crf.log_partition(emissions, masks)
    marginals = crf.marginals(emissions, masks)
    paths = crf.viterbi(emissions, masks)
    for b in range(batch):
        ref_log_z, scores, best, ref_marginal = brute_force(crf, emissions[b], masks[b])
        valid = [t for t in range(length) if masks[b, t]]
        gold = tuple(int(tags[b, t]) for t in valid)
        ref_nll = ref_log_z - scores[gold] if valid else torch.zeros((), dtype=torch.float64)
        assert abs(float(log_z[b] - ref_log_z)) < 1e-5
        assert abs(float(nll[b] - ref_nll)) < 1e-5
        assert torch.allclose(marginals[b, :, 1], ref_marginal, atol=1e-5)
        decoded = tuple(int(paths[b, t]) for t in valid)
        assert abs(float(scores[decoded] - scores[best])) < 1e-9 if valid else decoded == ()
        assert all(int(paths[b, t]) == 0 for t in range(length) if not masks[b, t])


def test_nll_is_differentiable_and_float32_agrees():
    crf = random_crf(7)
    emissions = torch.randn(3, 9, 2, dtype=torch.float64, requires_grad=True)
    tags = torch.randint(0, 2, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.bool)
    loss = crf.nll(emissions, tags, mask).sum()
    loss.backward()
    assert emissions.grad is not None and torch.isfinite(emissions.grad).all()
    crf32 = LinearChainCRF(2)
    crf32.load_state_dict({k: v.float() for k, v in crf.state_dict().items()})
    assert torch.allclose(
        crf32.nll(emissions.detach().float(), tags, mask), crf.nll(emissions.detach(), tags, mask).float(), atol=1e-4
    )


def test_transition_convention_is_from_to():
    crf = LinearChainCRF(2)
    with torch.no_grad():
        crf.transitions.copy_(torch.tensor([[0.0, 5.0], [0.0, 0.0]]))  # prune → keep is rewarded
    emissions = torch.zeros(1, 2, 2)
    score = crf.path_score(emissions, torch.tensor([[0, 1]]), torch.ones(1, 2, dtype=torch.bool))
    assert float(score.detach()) == pytest.approx(5.0)
    assert crf.viterbi(emissions, torch.ones(1, 2, dtype=torch.bool)).tolist() == [[0, 1]]
