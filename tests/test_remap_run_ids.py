"""scripts/remap_run_ids.py gives finished runs today's ids only when today's code would do what they did: a setting
added since at its declared default is a new spelling; one whose default resolves from the rest of the recipe, or a
changed default, is a different run and is left alone."""

import json
import sys
from pathlib import Path

import pytest

from vkv.errors import VkvError
from vkv.sweep.grid import build_method

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from remap_run_ids import remapped  # noqa: E402


def record(point: dict, drop: str) -> dict:
    """A finished run as an earlier version recorded it: today's config less the setting `drop` it did not have."""
    point = {"model": "smollm2-135m", "quant": "fp32", "ratio": 8.0, "seed": 0, **point}
    config = json.loads(json.dumps(build_method(point).config(), default=list))
    del config[drop]
    return {"run_id": "0" * 16, "run": point, "identity": {"model": "smollm2-135m", "config": config}}


def test_a_setting_added_at_its_declared_default_is_a_new_spelling():
    new = remapped(record({"method": "kvzip", "head_budget": "global"}, drop="normalise"))
    assert new["identity"]["config"]["normalise"] == "context" and new["run_id"] != "0" * 16


def test_a_setting_whose_default_resolves_from_the_recipe_is_a_different_run():
    old = record({"method": "vkv", "verbatim_share": 0.9, "share_scores": "reconstruction"}, drop="virtual_offset")
    with pytest.raises(VkvError, match="virtual_offset -4.0 \\(declared default None\\)"):
        remapped(old)


def test_a_changed_default_is_a_different_run():
    old = record({"method": "kvzip"}, drop="normalise")
    old["identity"]["config"]["head_budget"] = "adaptive"  # what kvzip's default was
    with pytest.raises(VkvError, match="head_budget 'adaptive' → 'global'"):
        remapped(old)


def test_a_setting_added_inside_a_nested_config_at_its_declared_default_is_a_new_spelling():
    old = record({"method": "vkv"}, drop="oversample")
    del old["identity"]["config"]["distill"]["step_tokens"]  # added to the distillation's settings since
    new = remapped(old)
    assert new["identity"]["config"]["distill"]["step_tokens"] == 0 and new["run_id"] != "0" * 16
    old["identity"]["config"]["optim"]["steps"] = 11  # and one of them changed is still a different run
    with pytest.raises(VkvError, match="optim.steps 11 → 10"):
        remapped(old)
