"""Block layout: blocks of equal surprisal mass and virtual tokens at their blocks' centres (tiny model)."""

import pytest
import torch

from tests.conftest import shared_mass
from tests.test_hybrid import evaluation, verbatim_entries  # noqa: F401  (a module fixture)
from vkv.compress.config import CompressConfig
from vkv.compress.hybrid import HybridConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.pooling import block_mass, partition, partition_by_mass
from vkv.compress.recipe import VkvRecipe
from vkv.compress.span import compress_span
from vkv.errors import VkvError
from vkv.lm.capture import capture_span
from vkv.methods import get_method

TEXT = (
    "The project hashes passwords with bcryptjs. Tests use the built-in node:test runner. "
    "The default JWT secret is dev-secret and finished tasks have the status done."
)


@pytest.mark.parametrize("floor", [0.0, 1.0])
def test_surprisal_blocks_carry_equal_mass_and_centred_positions(smol, floor):
    ids = smol.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    start, end = 2, 30
    config = CompressConfig(
        boundaries="surprisal",
        mass_floor=floor,
        positions="centres",
        head_budget="shared",  # one slot per block: the layout under test
        optim=OptimConfig(steps=2),
    )
    segment = compress_span(smol, ids, start, end, 4.0, config).segments[1]
    acts, _ = capture_span(smol, torch.tensor(ids[:end]), start, end)
    mass = block_mass(acts.surprisal, config.mass_floor)
    expected = partition_by_mass(mass, 7)
    assert expected != partition(end - start, 7)  # the layouts really differ on this text
    assert torch.equal(shared_mass(segment), expected.sizes())  # proportional attention follows the blocks
    assert torch.allclose(segment.positions, expected.centres(torch.arange(start, end)))
    per_block = torch.stack([mass[lo:hi].sum() for lo, hi in expected.ranges()])
    unequal = torch.stack([mass[lo:hi].sum() for lo, hi in partition(end - start, 7).ranges()])
    assert per_block.std() < unequal.std()  # closer to equal shares than equal token counts give


def test_hybrid_lays_out_its_virtual_blocks_by_surprisal(evaluation):  # noqa: F811
    config = CompressConfig(
        boundaries="surprisal", mass_floor=0.0, positions="centres", head_budget="shared", optim=OptimConfig(steps=2)
    )
    recipe = VkvRecipe(config, verbatim="shared", shared=HybridConfig(0.15, "surprisal"))
    segment = get_method("vkv", recipe=recipe).compress(evaluation.work, 3.2)
    work = evaluation.work
    kept = set(segment.stats["verbatim_positions"])
    rest = torch.tensor([p for p in range(work.start, work.end) if p not in kept]) - work.start
    blocks = partition_by_mass(block_mass(work.acts.surprisal[rest], config.mass_floor), segment.slots - len(kept))
    assert blocks != partition(len(rest), blocks.count)
    virtual = torch.ones(segment.slots, dtype=torch.bool)
    virtual[verbatim_entries(segment)] = False
    assert torch.equal(shared_mass(segment)[virtual], blocks.sizes())
    assert torch.allclose(segment.positions[virtual], blocks.centres(rest + work.start))


def test_unknown_boundaries_are_refused(tiny_llama):
    ids = tiny_llama.tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    with pytest.raises(VkvError, match="field boundaries: unknown value 'paragraphs'"):
        compress_span(tiny_llama, ids, 2, 30, 2.0, CompressConfig(boundaries="paragraphs", optim=OptimConfig(steps=1)))


def test_cli_records_the_block_layout(mini_transcript_path, tmp_path, test_model_dir):
    from vkv.cli import main
    from vkv.lm.rebuild import load_cache

    out = tmp_path / "c.safetensors"
    assert (
        main(
            [
                "compress",
                str(mini_transcript_path),
                "--method",
                "vkv",
                "--model",
                "smollm2-135m",
                "--span",
                "turns:3-4",
                "--steps",
                "2",
                "--boundaries",
                "surprisal",
                "--mass-floor",
                "0.5",
                "--positions",
                "centres",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    config = load_cache(out).meta["config"]["compress"]
    assert (config["boundaries"], config["mass_floor"], config["positions"]) == ("surprisal", 0.5, "centres")
    refused = tmp_path / "refused.safetensors"
    assert (
        main(
            [
                "compress",
                str(mini_transcript_path),
                "--method",
                "vkv",
                "--model",
                "smollm2-135m",
                "--span",
                "turns:3-4",
                "--mass-floor",
                "-1",
                "--out",
                str(refused),
            ]
        )
        == 2
    )
    assert not refused.exists()
