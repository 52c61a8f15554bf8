"""Earlier spellings: a renamed flag is refused in one sentence naming today's, and a recipe saved by an earlier
version loads through vkv.upgrade with the meaning it had then."""

from __future__ import annotations

import argparse

import pytest

from vkv import upgrade
from vkv.cli import main
from vkv.cli.method_flags import method_class
from vkv.compress.config import CompressConfig
from vkv.compress.recipe import VkvRecipe
from vkv.errors import VkvError
from vkv.methods import METHODS, get_method


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["compress", "t.json", "--sequential", "--out", "c.safetensors"], "--per-turn"),
        (["eval", "t.json", "--method", "full,sequential"], "--method vkv --per-turn"),
        (["compress", "t.json", "--method=sequential", "--out", "c.safetensors"], "--method vkv --per-turn"),
        (["eval", "t.json", "--method", "vkv,hybrid"], "--method vkv --verbatim shared"),
        (["eval", "t.json", "--method", "vkv", "--keep-verbatim"], "--verbatim shared"),
    ],
)
def test_a_renamed_flag_is_refused_naming_the_new_one(argv, named, capsys):
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "was renamed" in err and named in err


def test_only_flags_are_read_as_renamed():
    assert upgrade.old_flag(["compress", "sequential.json", "--method", "vkv", "--per-turn"]) is None
    assert upgrade.old_flag(["eval", "t.json", "--method", "vkv,am"]) is None


def test_vkv_modes_are_its_options_and_its_earlier_mode_methods_are_refused_naming_them():
    per_turn = argparse.Namespace(per_turn=True)
    assert method_class("vkv", per_turn) is METHODS["vkv"] is method_class("vkv", argparse.Namespace(per_turn=None))
    assert method_class("am", per_turn) is METHODS["am"]
    assert "sequential" not in METHODS and "hybrid" not in METHODS
    with pytest.raises(VkvError, match="method 'sequential' was renamed: it is method 'vkv' with per_turn=True"):
        method_class("sequential", per_turn)
    with pytest.raises(VkvError, match="method 'hybrid' was renamed: it is method 'vkv' with verbatim='shared'"):
        get_method("hybrid")


def test_an_old_saved_multiturn_recipe_loads_through_the_upgrade_module():
    saved = {
        "targets": "online",
        "hybrid": {"fraction": 0.2},
        "auto_ratio": None,
        "sequential": True,  # how `vkv compress` ran, as older cache headers record it beside the recipe
        "compress": {"ratio": 4.0, "head_share": "all", "pooling": "uniform"},
    }
    recipe = VkvRecipe.from_dict(saved)
    assert recipe.target_source == "online" and recipe.verbatim == "shared" and not recipe.auto_ratio
    assert recipe.shared.fraction == 0.2
    assert recipe.compress.head_budget == "shared" and recipe.compress.pooling == "uniform"
    assert recipe.compress.verbatim_share == 0.0 and recipe.compress.virtual_offset == 0.0  # as they ran then
    assert VkvRecipe.from_dict(recipe.to_dict()) == recipe  # today's spelling is left as it is
    keeping = VkvRecipe.from_dict({"keep_verbatim": True, "verbatim": {"fraction": 0.3}})  # the switch's spelling
    assert keeping.verbatim == "shared" and keeping.shared.fraction == 0.3


def test_runs_recorded_by_the_earlier_mode_methods_read_as_vkv_with_its_options():
    recipe = CompressConfig(pooling="uniform").to_dict()
    name, config = upgrade.method_config("sequential", {"compress": recipe, "keep_verbatim": True, "verbatim": {}})
    assert name == "vkv" and config["per_turn"] is True and config["verbatim"] == "shared"
    name, config = upgrade.method_config("hybrid", {**recipe, "verbatim": {"fraction": 0.1}})
    assert (name, config["verbatim"], config["shared"], config["per_turn"]) == (
        "vkv",
        "shared",
        {"fraction": 0.1},
        False,
    )
    assert config["compress"]["pooling"] == "uniform"
    name, config = upgrade.method_config("vkv", recipe)  # the bare virtual-token recipe vkv recorded
    assert config["compress"]["pooling"] == "uniform" and config["per_turn"] is False
    assert upgrade.method_config("kvzip", {"head_budget": "global"}) == ("kvzip", {"head_budget": "global"})
    point = upgrade.grid_point({"method": "hybrid", "hybrid.verbatim": {"fraction": 0.1}})
    assert point == {"method": "vkv", "verbatim": "shared", "verbatim_fraction": 0.1}
    assert upgrade.method_label("sequential") == "vkv per_turn=True" and upgrade.method_label("am") == "am"


def test_an_old_saved_recipe_loads_through_the_upgrade_module():
    recipe = CompressConfig.from_dict({"ratio": 8.0, "head_share": "adaptive"})
    assert recipe.head_budget == "adaptive" and recipe.share_scores == "readout" and recipe.verbatim_share == 0.0
    assert upgrade.recipe({}) == {}  # no recipe saved: today's defaults
