"""scripts/remap_run_ids.py gives finished runs today's ids only when today's code would do what they did: a setting
added since at its declared default is a new spelling; one whose default resolves from the rest of the recipe, or a
changed default, is a different run and is left alone."""

import json
import sys
from pathlib import Path

import pytest

from vkv.errors import VkvError
from vkv.sweep.grid import build_method
from vkv.sweep.plan import identity_hash

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from remap_run_ids import remapped  # noqa: E402


def record(point: dict, drop: str) -> dict:
    """A finished run as an earlier version recorded it: today's config less the setting `drop` (a dotted path) it did
    not have."""
    point = {"model": "smollm2-135m", "quant": "fp32", "ratio": 8.0, "seed": 0, **point}
    config = json.loads(json.dumps(build_method(point).config(), default=list))
    *parents, leaf = drop.split(".")
    node = config
    for part in parents:
        node = node[part]
    del node[leaf]
    return {"run_id": "0" * 16, "run": point, "identity": {"model": "smollm2-135m", "config": config}}


def test_a_setting_added_at_its_declared_default_is_a_new_spelling():
    new = remapped(record({"method": "kvzip", "head_budget": "global"}, drop="normalise"))
    assert new["identity"]["config"]["normalise"] == "context" and new["run_id"] != "0" * 16


def test_a_setting_whose_default_resolves_from_the_recipe_is_a_different_run():
    old = record({"method": "vkv", "verbatim_share": 0.9, "share_scores": "reconstruction"}, "compress.virtual_offset")
    with pytest.raises(VkvError, match="compress.virtual_offset 0.0 → -4.0"):  # run without the offset then
        remapped(old)


def test_a_changed_default_is_a_different_run():
    old = record({"method": "kvzip"}, drop="normalise")
    old["identity"]["config"]["head_budget"] = "adaptive"  # what kvzip's default was
    with pytest.raises(VkvError, match="head_budget 'adaptive' → 'global'"):
        remapped(old)


def test_a_setting_that_did_not_act_is_dropped_and_one_that_did_keeps_its_meaning():
    """vkv's targets' source acts only in a loop: a whole-span run that recorded the old default (oracle) takes
    today's id, which records none; a run in chunks that recorded it is a different run now that the default is online."""
    whole = record({"method": "vkv"}, drop="compress.oversample")
    whole["identity"]["config"]["target_source"] = "oracle"
    new = remapped(whole)
    assert "target_source" not in new["identity"]["config"] and new["run_id"] != "0" * 16
    looped = record({"method": "vkv", "vkv.every": 1024}, drop="compress.oversample")
    looped["identity"]["config"]["target_source"] = "oracle"
    with pytest.raises(VkvError, match="target_source 'oracle' → 'online'"):
        remapped(looped)


def test_a_setting_added_inside_a_nested_config_at_its_declared_default_is_a_new_spelling():
    old = record({"method": "vkv"}, drop="compress.oversample")
    del old["identity"]["config"]["compress"]["distill"]["step_tokens"]  # added to the distillation's settings since
    new = remapped(old)
    assert new["identity"]["config"]["compress"]["distill"]["step_tokens"] == 0 and new["run_id"] != "0" * 16
    old["identity"]["config"]["compress"]["optim"]["steps"] = 11  # and one of them changed is still a different run
    with pytest.raises(VkvError, match="compress.optim.steps 11 → 10"):
        remapped(old)


def test_a_run_of_an_earlier_mode_method_takes_the_id_vkv_with_its_option_plans():
    """A run recorded by `sequential` (vkv per turn, its config the multi-turn recipe) gets the id that
    `vkv = { per_turn = true }` plans today, and a run of `hybrid` the id of `verbatim = "shared"`."""
    today = {"model": "smollm2-135m", "quant": "fp32", "ratio": 8.0, "seed": 0}
    for old_point, new_point in (
        ({"method": "sequential"}, {"method": "vkv", "vkv.per_turn": True}),
        ({"method": "hybrid"}, {"method": "vkv", "verbatim": "shared"}),
    ):
        config = json.loads(json.dumps(build_method({**today, **new_point}).config(), default=list))
        per_turn = config.pop("per_turn")
        if old_point["method"] == "sequential":  # the multi-turn recipe it recorded, the switch spelling
            config = {**config, "keep_verbatim": False, "verbatim": config["shared"]}
            del config["shared"]
        else:  # the virtual tokens' recipe beside its verbatim settings
            config = {**config["compress"], "verbatim": config["shared"]}
        assert per_turn is (old_point["method"] == "sequential")
        old = {
            "run_id": "0" * 16,
            "run": {**today, **old_point},
            "identity": {"model": "smollm2-135m", "config": config},
        }
        identity = {"model": "smollm2-135m", "config": build_method({**today, **new_point}).config()}
        assert remapped(old)["run_id"] == identity_hash(json.loads(json.dumps(identity, default=list)))
