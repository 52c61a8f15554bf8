"""`vkv bench cache` measures plain transformers beside vkv's layouts on the same window: the reference's cache holds
the whole window, its decode time comes from the model's own generate(), and each layout's time is read against it."""

from pathlib import Path

from vkv.tools.bench_cache import LAYOUTS, CacheBenchConfig, bench_window, own_attention

ROOT = Path(__file__).resolve().parents[1]


def test_each_record_has_the_transformers_reference_beside_the_layouts(tiny_llama):
    config = CacheBenchConfig(methods=("kvzip",), ratios=(4.0,), question_tokens=4, new_tokens=3, rounds=1)
    (record,) = bench_window(tiny_llama, ROOT / "transcripts/dev/gen-ci-failure-2.json", 256, config, lambda *_: None)
    reference = record["transformers"]
    assert reference["span_bytes"] == record["full"]["span_bytes"]  # the whole window's K/V, as vkv's full layout
    assert reference["decode_ms_per_token"] > 0 and len(reference["decode_ms_rounds"]) == 1
    for layout in LAYOUTS:
        ratio = record[layout]["decode_ms_per_token"] / reference["decode_ms_per_token"]
        assert abs(record[f"decode_{layout}_over_transformers"] - ratio) < 1e-2


def test_the_reference_runs_the_models_own_attention_and_gives_vkvs_back(tiny_llama):
    model = tiny_llama.model
    before = model.config._attn_implementation
    assert before.startswith("vkv_")  # what a FrozenLM's model runs, so that it reads ragged caches
    with own_attention(model):
        assert model.config._attn_implementation in ("sdpa", "eager")
    assert model.config._attn_implementation == before
