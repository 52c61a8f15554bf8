import pytest
import torch

from vkv.compress.budget import entries_at
from vkv.compress.pooling import (
    block_mass,
    block_weights,
    partition,
    partition_by_mass,
    pool,
    surprisal_scores,
)
from vkv.compress.positions import virtual_positions
from vkv.errors import VkvError


def test_entries_at_rounds_and_refuses_bad_ratios():
    assert entries_at(320, 3.2) == 100
    assert entries_at(5, 100.0) == 1
    with pytest.raises(VkvError, match="at least 1"):
        entries_at(100, 0.5)
    with pytest.raises(VkvError, match="empty"):
        entries_at(0, 2.0)


def test_equal_partition_tiles_the_span():
    blocks = partition(10, 3)
    assert blocks.edges[0] == 0 and blocks.edges[-1] == 10 and blocks.count == 3
    assert all(hi > lo for lo, hi in blocks.ranges())


def test_snapped_partition_prefers_cut_candidates_and_keeps_blocks_non_empty():
    blocks = partition(20, 4, cut_candidates=[4, 11, 14, 19])
    assert blocks.edges == (0, 4, 11, 14, 20)
    squeezed = partition(4, 4, cut_candidates=[1])
    assert squeezed.edges == (0, 1, 2, 3, 4)


def test_surprisal_weights_are_proportional_and_normalised_per_block():
    blocks = partition(4, 2)
    s = torch.tensor([1.0, 3.0, float("nan"), 2.0])
    w = block_weights("surprisal", blocks, s)
    assert torch.allclose(w[:2], torch.tensor([0.25, 0.75]))
    assert torch.allclose(w[2:].sum(), torch.tensor(1.0))  # the NaN takes the mean surprisal
    assert torch.allclose(block_weights("uniform", blocks, s), torch.full((4,), 0.5))
    with pytest.raises(VkvError, match="question-specific"):
        block_weights("attention", blocks, s)
    with pytest.raises(VkvError, match="unknown pooling"):
        block_weights("median", blocks, s)


def test_pool_is_a_weighted_block_sum():
    blocks = partition(4, 2)
    x = torch.arange(8.0).reshape(1, 4, 2)
    w = torch.tensor([0.5, 0.5, 1.0, 0.0])
    out = pool(x, blocks, w, dim=1)
    assert torch.allclose(out, torch.tensor([[[1.0, 2.0], [4.0, 5.0]]]))


def test_position_schemes():
    assert torch.allclose(virtual_positions("interpolate", 144, 386, 3), torch.tensor([144.0, 264.5, 385.0]))
    assert torch.allclose(virtual_positions("rounded", 144, 386, 3), torch.tensor([144.0, 264.0, 385.0]))
    assert torch.allclose(virtual_positions("consecutive", 144, 386, 3), torch.tensor([144.0, 145.0, 146.0]))
    with pytest.raises(VkvError, match="unknown position scheme"):
        virtual_positions("spiral", 0, 10, 2)


def test_mass_partition_gives_dense_stretches_more_blocks():
    mass = torch.tensor([1.0] * 8 + [4.0] * 4)  # the last third holds two thirds of the mass
    blocks = partition_by_mass(mass, 6)
    assert blocks.edges[0] == 0 and blocks.edges[-1] == 12 and all(hi > lo for lo, hi in blocks.ranges())
    assert blocks.edges == (0, 4, 8, 9, 10, 11, 12)
    assert partition_by_mass(torch.zeros(10), 3) == partition(10, 3)
    spike = partition_by_mass(torch.tensor([0.0, 0.0, 100.0, 0.0, 0.0]), 5)
    assert spike.edges == (0, 1, 2, 3, 4, 5)  # every block stays non-empty however the mass is placed
    with pytest.raises(VkvError, match="non-negative"):
        partition_by_mass(torch.tensor([1.0, -1.0]), 1)
    with pytest.raises(VkvError, match="cannot split"):
        partition_by_mass(torch.ones(3), 4)


def test_block_centres_scheme_follows_the_blocks():
    blocks = partition_by_mass(torch.tensor([1.0] * 8 + [4.0] * 4), 6)
    centres = blocks.centres(torch.arange(100, 112))
    assert torch.allclose(centres, torch.tensor([101.5, 105.5, 108.0, 109.0, 110.0, 111.0]))
    assert torch.equal(virtual_positions("centres", 100, 112, 6, centres), centres)
    equal = partition(512, 160)
    gap = virtual_positions("centres", 0, 512, 160, equal.centres(torch.arange(512))) - virtual_positions(
        "interpolate", 0, 512, 160
    )
    assert gap.abs().max() <= 1.6  # half a block at most, for equal blocks
    with pytest.raises(VkvError, match="needs the blocks"):
        virtual_positions("centres", 0, 12, 6)
    with pytest.raises(VkvError, match="shape"):
        virtual_positions("centres", 0, 12, 6, centres[:3])


def test_block_mass_floor_moves_surprisal_blocks_towards_equal_ones():
    s = torch.tensor([float("nan"), 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 6.0, 5.0, 7.0, 6.0])
    assert torch.equal(block_mass(s, 0.0), surprisal_scores(s))
    pure, floored, flat = (partition_by_mass(block_mass(s, f), 4) for f in (0.0, 1.0, 1000.0))
    longest = [max(hi - lo for lo, hi in b.ranges()) for b in (pure, floored, flat)]
    assert longest[0] > longest[1] > longest[2] and flat == partition(12, 4)
    with pytest.raises(VkvError, match="floor must be ≥ 0"):
        block_mass(s, -0.5)
