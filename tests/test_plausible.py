"""The plausibility check holds a loaded cache to the model's own scale: every method's real cache passes, edits of
magnitude are refused in one sentence naming the segment, layer, KV head and field, and the probe runs once per
model."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import FIXTURES
from vkv.cli import main
from vkv.errors import VkvError
from vkv.lm.plausible import BOUNDS, MAX_BIAS, check_plausible, head_rms, probe
from vkv.lm.rebuild import load_cache

MODEL = ["--model", "smollm2-135m", "--quant", "fp32"]


@pytest.fixture(scope="module")
def method_caches(tmp_path_factory) -> dict[str, object]:
    """Real caches of the test model by the methods whose entries are not the model's own tokens' (fitted values and
    biases, chosen entries, virtual tokens); kvopt with few Adam steps, which already moves its values off the model's."""
    root = tmp_path_factory.mktemp("methods")
    paths = {}
    for method, extra in (
        ("am", []),
        ("kvzip", []),
        ("snapkv", []),
        ("knorm", []),
        ("kvopt", ["--adam-steps", "5"]),
        ("vkv", ["--steps", "2"]),
    ):
        paths[method] = root / f"{method}.safetensors"
        argv = ["compress", str(FIXTURES / "mini-agent.json"), *MODEL, "--method", method, "--ratio", "8"]
        assert main([*argv, *extra, "--out", str(paths[method])]) == 0
    return paths


def test_the_probe_runs_once_per_model_and_gives_each_head_a_scale(smol, monkeypatch):
    stats = probe(smol)
    spec = smol.spec
    assert stats.keys.shape == stats.values.shape == (spec.num_layers, spec.num_kv_heads)
    assert bool((stats.keys > 0).all()) and bool((stats.values > 0).all()) and stats.embeddings > 0
    monkeypatch.setattr(smol, "forward_kv", lambda *a, **k: pytest.fail("the probe ran twice"))
    assert probe(smol) is stats


def test_head_rms_counts_only_the_slots_a_head_reaches():
    entries = torch.tensor([[[3.0, 3.0], [100.0, 100.0]], [[1.0, 1.0], [1.0, 1.0]]])
    reached = torch.tensor([[True, False], [False, False]])
    rms = head_rms(entries, reached)
    assert rms[0] == 3.0 and bool(rms[1].isnan())


@pytest.mark.parametrize("method", ["am", "kvzip", "snapkv", "knorm", "kvopt", "vkv"])
def test_every_methods_real_cache_is_plausible(smol, method_caches, method):
    load_cache(method_caches[method], smol)  # refusing raises


def edited(cache, field: str, layer: int, head: int, change):
    segment = cache.segments[-1]
    tensor = getattr(segment, field).clone()
    tensor[layer, head] = change(tensor[layer, head])
    setattr(segment, field, tensor)
    return cache


@pytest.mark.parametrize(
    "field, change, message",
    [
        ("values", lambda t: t * 1e6, "segments[1].values: layer 2, KV head 1: RMS"),
        ("values", lambda t: t * 0, "segments[1].values: layer 2, KV head 1: every value it reaches is zero"),
        ("keys", lambda t: t * 1e-6, "segments[1].keys: layer 2, KV head 1: RMS"),
        ("keys", lambda t: t * float("nan"), "segments[1].keys: layer 2, KV head 1 holds numbers that are not finite"),
        ("bias", lambda t: t + 2 * MAX_BIAS, "segments[1].bias: layer 2, KV head 1 holds"),
    ],
)
def test_one_heads_edit_is_named_by_segment_layer_head_and_field(smol, method_caches, field, change, message):
    cache = edited(load_cache(method_caches["am"], smol), field, 2, 1, change)
    with pytest.raises(VkvError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        check_plausible(smol, cache, "c.safetensors")
    assert str(err.value).startswith("c.safetensors: field ") and "\n" not in str(err.value)


def test_the_bounds_leave_room_for_fitted_values(smol, method_caches):
    """am's least-squares values reach a couple of hundred times the probe's on heads whose own values are small: the
    bound must not refuse them (measured in vkv/lm/plausible.py's docstring)."""
    cache = load_cache(method_caches["am"], smol)
    scale = probe(smol)
    worst = 0.0
    for seg in cache.segments:
        reached = None if seg.bias is None else torch.isfinite(seg.bias)
        for layer in range(seg.values.shape[0]):
            rms = head_rms(seg.values[layer], None if reached is None else reached[layer]) / scale.values[layer]
            worst = max(worst, float(rms.nan_to_num(0).max()))
    assert 1 < worst < BOUNDS["values"][1] / 30
