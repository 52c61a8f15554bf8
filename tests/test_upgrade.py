"""Earlier spellings: a renamed flag is refused in one sentence naming today's, and a recipe saved by an earlier
version loads through vkv.upgrade with the meaning it had then."""

from __future__ import annotations

import argparse

import pytest

from vkv import upgrade
from vkv.cli import main
from vkv.cli.method_flags import method_class
from vkv.compress.config import CompressConfig
from vkv.compress.sequential import MultiTurnConfig
from vkv.errors import VkvError
from vkv.methods import METHODS


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["compress", "t.json", "--sequential", "--out", "c.safetensors"], "--per-turn"),
        (["eval", "t.json", "--method", "full,sequential"], "--method vkv --per-turn"),
        (["compress", "t.json", "--method=sequential", "--out", "c.safetensors"], "--method vkv --per-turn"),
        (["eval", "t.json", "--method", "vkv,hybrid"], "--method vkv --keep-verbatim"),
    ],
)
def test_a_renamed_flag_is_refused_naming_the_new_one(argv, named, capsys):
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "was renamed" in err and named in err


def test_only_flags_are_read_as_renamed():
    assert upgrade.old_flag(["compress", "sequential.json", "--method", "vkv", "--per-turn"]) is None
    assert upgrade.old_flag(["eval", "t.json", "--method", "vkv,am"]) is None


def test_vkv_per_turn_is_the_turn_by_turn_method_and_its_old_name_is_no_method():
    per_turn = argparse.Namespace(per_turn=True)
    assert method_class("vkv", per_turn) is METHODS["sequential"]
    assert method_class("vkv", argparse.Namespace(per_turn=None)) is METHODS["vkv"]
    assert method_class("am", per_turn) is METHODS["am"]
    with pytest.raises(VkvError, match="unknown method 'sequential'"):
        method_class("sequential", per_turn)


def test_vkv_keeping_verbatim_tokens_is_the_hybrid_method_and_its_old_name_is_no_method():
    keep = argparse.Namespace(per_turn=None, keep_verbatim=True)
    assert method_class("vkv", keep) is METHODS["hybrid"]
    assert method_class("kvzip", keep) is METHODS["kvzip"]
    both = argparse.Namespace(per_turn=True, keep_verbatim=True)  # per turn, the verbatim share is in its recipe
    assert method_class("vkv", both) is METHODS["sequential"]
    with pytest.raises(VkvError, match="unknown method 'hybrid'; choose from .*kvzip"):
        method_class("hybrid", keep)


def test_an_old_saved_multiturn_recipe_loads_through_the_upgrade_module():
    saved = {
        "targets": "online",
        "hybrid": {"fraction": 0.2},
        "auto_ratio": None,
        "sequential": True,  # how `vkv compress` ran, as older cache headers record it beside the recipe
        "compress": {"ratio": 4.0, "head_share": "all", "pooling": "uniform"},
    }
    recipe = MultiTurnConfig.from_dict(saved)
    assert recipe.target_source == "online" and recipe.keep_verbatim and not recipe.auto_ratio
    assert recipe.verbatim.fraction == 0.2
    assert recipe.compress.head_budget == "shared" and recipe.compress.pooling == "uniform"
    assert recipe.compress.verbatim_share == 0.0 and recipe.compress.virtual_offset == 0.0  # as they ran then
    assert MultiTurnConfig.from_dict(recipe.to_dict()) == recipe  # today's spelling is left as it is


def test_an_old_saved_recipe_loads_through_the_upgrade_module():
    recipe = CompressConfig.from_dict({"ratio": 8.0, "head_share": "adaptive"})
    assert recipe.head_budget == "adaptive" and recipe.share_scores == "readout" and recipe.verbatim_share == 0.0
    assert upgrade.recipe({}) == {}  # no recipe saved: today's defaults
