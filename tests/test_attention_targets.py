"""Attention read-out targets: virtual tokens must give a query arriving after the span what the span gave it."""

import math

import pytest
import torch

from tests.conftest import FIXTURES
from vkv.compress.config import CompressConfig
from vkv.compress.hybrid import HybridConfig, HybridRecipe, hybrid_segment
from vkv.compress.kv_loss import layer_losses
from vkv.compress.optimise import OptimConfig, optimise
from vkv.compress.pooling import block_weights, partition
from vkv.compress.positions import virtual_positions
from vkv.compress.recipe import VkvRecipe
from vkv.compress.span import compress_span
from vkv.compress.targets import build_targets
from vkv.errors import VkvError
from vkv.kv.prefix import KVPrefix
from vkv.lm.capture import capture_span
from vkv.text.transcript import load_transcript, render


def _span(lm):
    rendered = render(load_transcript(FIXTURES / "mini-agent.json"), lm.tokenizer)
    return rendered.ids, rendered.spans[1].start, rendered.spans[3].start


def _targets(lm, ids, start, end, k, proportional=True, queries=16):
    acts, cache = capture_span(lm, ids, start, end, keep_cache=True, queries=True)
    blocks = partition(end - start, k)
    weights = block_weights("surprisal", blocks, acts.surprisal)
    targets = build_targets(lm, torch.tensor(ids), acts, blocks, weights, "v+attention", proportional, queries)
    return acts, KVPrefix.from_cache(cache, start), targets


def test_the_original_tokens_have_no_readout_error_and_a_wrong_mass_does(tiny):
    ids, start, end = _span(tiny)
    acts, _, targets = _targets(tiny, ids, start, end, k=end - start)  # one block per token: mass 1
    assert targets.attention.count == min(16, end - start) * tiny.spec.num_heads // tiny.spec.num_kv_heads
    keys = [tiny.rotate(k, torch.arange(start, end).float())[None] for k in acts.keys_pre_rope]
    values = [v[None] for v in acts.values]
    assert float(layer_losses(keys, values, targets, "mse").max()) < 1e-8

    targets.attention.log_mass = torch.full((end - start,), math.log(2.0))  # every entry counted twice
    doubled = layer_losses(keys, values, targets, "mse")
    torch.testing.assert_close(doubled, torch.full_like(doubled, math.log(2.0) ** 2), rtol=1e-4, atol=1e-5)
    targets.attention.weight = 0.25
    torch.testing.assert_close(layer_losses(keys, values, targets, "mse"), 0.25 * doubled)


def test_log_mass_follows_proportional_attention(tiny_llama):
    ids, start, end = _span(tiny_llama)
    _, _, on = _targets(tiny_llama, ids, start, end, k=5)
    _, _, off = _targets(tiny_llama, ids, start, end, k=5, proportional=False)
    sizes = torch.tensor([b - a for a, b in on.blocks.ranges()], dtype=torch.float32)
    torch.testing.assert_close(on.attention.log_mass, sizes.log())
    assert off.attention.log_mass.abs().max() == 0


def test_optimising_lowers_the_readout_error_and_batches_agree(tiny_llama):
    ids, start, end = _span(tiny_llama)
    _, prefix, targets = _targets(tiny_llama, ids, start, end, k=6)
    positions = virtual_positions("interpolate", start, end, 6)
    result = optimise(tiny_llama, prefix, targets, positions, OptimConfig(steps=15, init="pooled"))
    assert result.best_loss < 0.9 * result.initial_loss
    with torch.no_grad():
        keys, values = tiny_llama.forward_kv(result.embeddings[None], positions, prefix)
    torch.testing.assert_close(
        float(layer_losses(keys, values, targets, "mse").mean()), result.best_loss, rtol=1e-4, atol=1e-6
    )


def test_compress_with_attention_targets_end_to_end(tiny_llama):
    ids, start, end = _span(tiny_llama)
    config = CompressConfig(target="v+attention", optim=OptimConfig(steps=2))
    spliced = compress_span(tiny_llama, ids, start, end, 3.0, config)
    assert spliced.segments[1].kind == "compact" and spliced.segments[1].real_entries == round((end - start) / 3)


def test_per_turn_and_per_turn_verbatim_refuse_attention_targets(tiny_llama):
    with pytest.raises(VkvError, match="not implemented for per-turn compression"):
        VkvRecipe(compress=CompressConfig(target="v+attention")).check_turn_by_turn()
    ids, start, end = _span(tiny_llama)
    acts, cache = capture_span(tiny_llama, ids, start, end, keep_cache=True)
    span_kv = KVPrefix(
        [k[:, :, start:end] for k in KVPrefix.from_cache(cache).keys],
        [v[:, :, start:end] for v in KVPrefix.from_cache(cache).values],
    )
    with pytest.raises(VkvError, match="not v\\+attention"):
        hybrid_segment(
            tiny_llama,
            ids,
            acts,
            span_kv,
            KVPrefix.from_cache(cache, start),
            5,
            HybridRecipe(target="v+attention"),
            HybridConfig(0.2),
        )


def test_cli_compresses_with_attention_targets_and_records_them(mini_transcript_path, tmp_path, test_model_dir):
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
                "--ratio",
                "3.2",
                "--span",
                "turns:3-4",
                "--steps",
                "3",
                "--target",
                "v+attention",
                "--attention-weight",
                "0.5",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    config = load_cache(out).meta["config"]["compress"]
    assert config["target"] == "v+attention" and config["attention_weight"] == 0.5
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
                "--target",
                "v+attention",
                "--per-turn",
                "--out",
                str(tmp_path / "s.safetensors"),
            ]
        )
        == 2
    )


def test_a_negative_read_out_weight_is_refused_whatever_the_target(mini_transcript_path, tmp_path, capsys):
    from vkv.cli import main

    with pytest.raises(VkvError, match="field attention_weight: must be a finite number at least 0, got -1"):
        CompressConfig(attention_weight=-1.0).validate()
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
                "--attention-weight",
                "-1",
                "--out",
                str(tmp_path / "c.safetensors"),
            ]
        )
        == 2
    )
    assert "--attention-weight" in capsys.readouterr().err and not (tmp_path / "c.safetensors").exists()
