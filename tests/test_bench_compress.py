"""`vkv bench compress`: the shipped shapes are the published architectures, random-weight models build from them
(in 8 bits too, and by layers), and the bench runs end to end on the tiny shape, reporting every stage a method
records (its timings are written, never asserted)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from vkv.cli import main
from vkv.lm.shapes import build_random, shape_config
from vkv.stages import stage
from vkv.text.transcript import render
from vkv.tools import bench_compress
from vkv.tools.bench_compress import RANDOM_WEIGHTS, synthetic_transcript

# (parameters, of which outside the input embedding) as the model cards publish them, in billions
PUBLISHED = {
    "qwen2.5-coder-7b": (7.61, 7.61 - 0.54),  # 6.53 non-embedding + the untied LM head
    "qwen2.5-coder-1.5b": (1.54, 1.31),
    "llama-3.1-8b": (8.03, None),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_each_shape_has_its_published_parameter_count(name):
    with torch.device("meta"):  # shapes only: no memory, no time
        model = AutoModelForCausalLM.from_config(shape_config(name))
    total = sum(p.numel() for p in model.parameters()) / 1e9
    beside_embedding = total - model.get_input_embeddings().weight.numel() / 1e9
    expected_total, expected_beside = PUBLISHED[name]
    assert total == pytest.approx(expected_total, abs=0.006)
    if expected_beside is not None:
        assert beside_embedding == pytest.approx(expected_beside, abs=0.006)
    assert model.config.num_key_value_heads * model.config.head_dim <= model.config.hidden_size


def test_llama_shape_keeps_its_long_context_rope():
    config = shape_config("llama-3.1-8b", layers=1)
    assert config.num_hidden_layers == 1
    assert config.rope_parameters["rope_type"] == "llama3"
    assert config.rope_parameters["factor"] == 8.0 and config.rope_parameters["rope_theta"] == 500000.0
    assert config.max_position_embeddings == 131072


def test_more_layers_than_a_shape_has_are_refused():
    with pytest.raises(Exception, match="field layers: 29 is more than the 28 layers"):
        shape_config("qwen2.5-coder-7b", layers=29)


def test_an_8bit_random_model_computes_with_int8_layers(smol_tokenizer):
    import bitsandbytes as bnb

    lm = build_random("tiny-qwen2", smol_tokenizer, quant="8bit", device="cpu", layers=1)
    linears = [m for m in lm.model.model.layers.modules() if isinstance(m, bnb.nn.Linear8bitLt)]
    assert len(linears) == 7 and all(m.weight.dtype == torch.int8 for m in linears)
    assert lm.config.num_hidden_layers == 1 and lm.quant == "8bit"
    logits = lm.model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()


def test_the_synthetic_conversation_is_long_enough_and_takes_turns(smol_tokenizer):
    transcript = synthetic_transcript(smol_tokenizer, 700, seed=3)
    roles = [m.role for m in transcript.messages]
    assert roles[0] == "system" and all(a != b for a, b in zip(roles[1:], roles[2:]))
    assert len(render(transcript, smol_tokenizer).ids) > 700
    assert synthetic_transcript(smol_tokenizer, 700, seed=3) == transcript
    assert synthetic_transcript(smol_tokenizer, 700, seed=4) != transcript


def test_help_lists_the_flags(capsys):
    assert main(["bench", "compress", "--help"]) == 0  # argparse's exit code, returned
    out = capsys.readouterr().out
    for flag in ("--shape", "--layers", "--tokens", "--quant", "--device", "--methods", "--ratio", "--json"):
        assert flag in out
    assert "qwen2.5-coder-7b" in out and "llama-3.1-8b" in out


def test_bench_reports_every_stage_each_method_records(test_model_dir, tmp_path, capsys, monkeypatch):
    real = bench_compress.get_method

    class Staged:  # kvzip, with its work inside a stage of its own, as the methods' own stages are
        def __init__(self, name):
            self.method = real(name)

        def compress(self, work, ratio):
            with stage("selection", work.lm.device):
                return self.method.compress(work, ratio)

    monkeypatch.setattr(bench_compress, "get_method", lambda name: Staged(name) if name == "kvzip" else real(name))
    out = tmp_path / "compress.json"
    argv = ["bench", "compress", "--shape", "tiny-qwen2", "--layers", "1", "--tokens", "300", "--methods", "kvzip,am"]
    assert main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["note"] == RANDOM_WEIGHTS and report["shape"] == "tiny-qwen2"
    assert report["layers_built"] == 1 and report["layers_full"] == 2 and report["window_tokens"] == 300
    assert report["model_config"]["num_hidden_layers"] == 1 and report["dtype"] == "float32"
    records = {r["method"]: r for r in report["records"]}
    assert list(records) == ["prefill", "kvzip", "am"]
    assert set(records["prefill"]["stages"]) == {"prefill"}
    assert set(records["kvzip"]["stages"]) >= {"selection"}
    assert 0 < records["kvzip"]["stages"]["selection"] <= records["kvzip"]["total"]
    assert all(r["total"] > 0 and r["peak_device_mb"] is None for r in records.values())
    stdout = capsys.readouterr().out
    assert "no quality" in stdout and "selection s" in stdout and "peak host MB" in stdout


def test_a_crashing_method_is_reported_and_the_others_still_measured(test_model_dir, tmp_path, capsys, monkeypatch):
    real = bench_compress.get_method

    class Broken:
        def compress(self, work, ratio):
            raise RuntimeError("expected m1 and m2 to have the same dtype")

    monkeypatch.setattr(bench_compress, "get_method", lambda name: Broken() if name == "knorm" else real(name))
    out = tmp_path / "compress.json"
    argv = ["bench", "compress", "--shape", "tiny-qwen2", "--tokens", "200", "--methods", "knorm,truncate"]
    assert main([*argv, "--json", str(out)]) == 1
    records = {r["method"]: r for r in json.loads(out.read_text())["records"]}
    assert records["knorm"]["crashed"] and "RuntimeError: expected m1 and m2" in records["knorm"]["error"]
    assert records["truncate"]["total"] > 0 and "error" not in records["truncate"]
    captured = capsys.readouterr()
    assert "Traceback" in captured.err and "knorm crashed" in captured.out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--layers", "2"], "field layers: only a random-weight model is built by layers"),
        (["--shape", "tiny-qwen2", "--quant", "4bit"], "field quant: '4bit' is not built for random-weight shapes"),
        (["--shape", "tiny-qwen2", "--tokens", "9000"], "field tokens: a window of 9000 tokens"),
    ],
)
def test_what_cannot_be_measured_is_refused_in_one_sentence(argv, message, test_model_dir, tmp_path, capsys):
    assert main(["bench", "compress", *argv, "--methods", "kvzip", "--json", str(tmp_path / "c.json")]) == 2
    assert message in capsys.readouterr().err
