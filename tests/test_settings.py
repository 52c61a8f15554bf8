"""Settings are declared once: every field of vkv's recipe (CompressConfig inside VkvRecipe) is a flag of `vkv
compress` and `vkv eval` and a sweep key, with the field's default."""

import dataclasses
import json
import typing

import pytest

from vkv.cli import build_parser, recipe_from_args
from vkv.compress.config import CompressConfig
from vkv.compress.recipe import VkvRecipe
from vkv.errors import VkvError
from vkv.settings import check_value, flat_settings, from_dict, from_flat
from vkv.sweep.grid import build_method, expand, load_experiment

SETTINGS = flat_settings(VkvRecipe)


def test_nested_settings_get_flat_keys():
    keys = {s.key: s.path for s in SETTINGS}
    assert keys["steps"] == ("compress", "optim", "steps") and keys["distill_steps"] == ("compress", "distill", "steps")
    assert "ratio" not in keys  # each command takes its ratio its own way
    assert (
        keys["verbatim_fraction"] == ("shared", "fraction")
        and keys["verbatim"] == ("verbatim",)
        and keys["max_loss"] == ("tolerance", "max_loss")
    )
    assert len(keys) == len(SETTINGS)  # no two settings share a key


def _changed(setting):
    """A value different from the default that the setting accepts."""
    allowed = setting.allowed()
    if allowed:
        return next(v for v in allowed if v != setting.default)
    if isinstance(setting.default, bool):
        return not setting.default
    if set(typing.get_args(setting.kind)) == {bool, type(None)}:  # a switch whose default the recipe decides
        return False
    if setting.key == "distill_probes":
        return ("summary",)
    if setting.key in ("verbatim_fraction", "verbatim_max_share", "verbatim_share"):  # fractions below 1
        return (setting.default or 1.0) / 2
    if setting.key == "ladder":  # ratios of at least 1
        return (2.0, 4.0)
    if isinstance(setting.default, tuple) or "tuple" in str(setting.kind):
        return (0.5, 0.25)
    if setting.default is None:
        return 0.5
    return type(setting.default)(setting.default + 1)


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


@pytest.mark.parametrize("command", ["compress", "eval"])
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_every_setting_is_a_flag_that_reaches_the_config(command, setting):
    value = _changed(setting)
    flag = [setting.flag] if isinstance(value, bool) else [setting.flag, _text(value)]
    if isinstance(value, bool) and not value:
        flag = ["--no-" + setting.flag[2:]]
    if setting.path[0] == "tolerance" or setting.key == "auto_ratio":  # each is refused without the other
        flag += ["--auto-ratio", "--max-loss", "0.3"] if setting.key != "max_loss" else ["--auto-ratio"]
    args = build_parser().parse_args(
        [command, "t.json", *flag] + (["--out", "c.safetensors"] if command == "compress" else [])
    )
    config = recipe_from_args(args)
    node = config
    for part in setting.path:
        node = getattr(node, part)
    assert node == value


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.key)
def test_every_setting_is_a_sweep_key(tmp_path, setting):
    value = _changed(setting)
    if setting.key == "seed":  # the grid's seeds axis sets it
        setting = dataclasses.replace(setting, key="seeds")
        value = [value]
    toml = json.dumps([list(value)] if isinstance(value, tuple) else value)  # a tuple value is one list in a list
    extra = {"max_loss": "auto_ratio = true\n", "ladder": "auto_ratio = true\nmax_loss = 0.3\n"}.get(setting.key, "")
    extra += "max_loss = 0.3\n" if setting.key == "auto_ratio" else ""
    (tmp_path / "t.json").write_text("{}")
    (tmp_path / "e.toml").write_text(
        f'[defaults]\nmodel = "m"\ntranscripts = ["t.json"]\n[[grid]]\nmethods = ["vkv"]\nratios = [2]\n'
        f"{setting.key} = {toml}\n{extra}"
    )
    (point,) = expand(load_experiment(tmp_path / "e.toml"))
    node = build_method(point).recipe
    for part in setting.path:
        node = getattr(node, part)
    assert node == (value[0] if setting.key == "seeds" else value)


def test_from_dict_round_trips_and_refuses_unknown_keys():
    config = CompressConfig(pooling="uniform")
    config.optim.steps = 7
    assert from_dict(CompressConfig, dataclasses.asdict(config)) == config
    assert from_flat(CompressConfig, {"steps": 7, "pooling": "uniform", "unrelated": 1}) == config
    with pytest.raises(VkvError, match="unknown CompressConfig setting.*poolin"):
        from_dict(CompressConfig, {"poolin": "uniform"})
    with pytest.raises(VkvError, match="unknown OptimConfig setting.*stepz"):
        from_dict(CompressConfig, {"optim": {"stepz": 3}})


def test_check_value_names_the_field():
    steps = next(s for s in SETTINGS if s.key == "steps")
    pooling = next(s for s in SETTINGS if s.key == "pooling")
    assert check_value(next(s for s in SETTINGS if s.key == "lr"), 1, "") == 1.0
    with pytest.raises(VkvError, match="field steps: expected int"):
        check_value(steps, "many", "")
    with pytest.raises(VkvError, match="field pooling: unknown value 'median'"):
        check_value(pooling, "median", "")


def _configs():
    from vkv.compress.autoratio import AutoRatioConfig
    from vkv.compress.distill import DistillConfig
    from vkv.compress.hybrid import HybridConfig
    from vkv.compress.optimise import OptimConfig
    from vkv.evals.runner import EvalSettings
    from vkv.tools.bench_cache import CacheBenchConfig

    return [
        CompressConfig,
        OptimConfig,
        DistillConfig,
        VkvRecipe,
        HybridConfig,
        AutoRatioConfig,
        EvalSettings,
        CacheBenchConfig,
    ]


@pytest.mark.parametrize("config", _configs(), ids=lambda c: c.__name__)
def test_every_number_setting_declares_its_range(config):
    import dataclasses
    import typing

    hints = typing.get_type_hints(config)
    for f in dataclasses.fields(config):
        kinds = {hints[f.name]} | set(typing.get_args(hints[f.name]))
        if "nested" not in f.metadata and kinds & {int, float}:
            assert f.metadata.get("minimum") is not None, f"{config.__name__}.{f.name} has no declared range"


def test_a_range_is_refused_alike_by_flags_sweeps_and_the_python_api(tmp_path, capsys):
    from vkv.cli import main
    from vkv.compress.optimise import OptimConfig
    from vkv.errors import VkvError
    from vkv.settings import from_dict

    assert main(["compress", "t.json", "--out", str(tmp_path / "c.safetensors"), "--steps", "-1"]) == 2
    assert "--steps" in capsys.readouterr().err
    with pytest.raises(VkvError, match="field steps: must be a finite number at least 0"):
        CompressConfig(optim=OptimConfig(steps=-1)).validate()
    with pytest.raises(VkvError, match="field oversample: must be a finite number above 1"):
        from_dict(CompressConfig, {"oversample": 1.0})
    with pytest.raises(VkvError, match="field distill_lr"):
        from_dict(CompressConfig, {"distill": {"lr": float("nan")}})
