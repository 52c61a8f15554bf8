"""Embeddings-only cache files (`--store embeddings`): K/V rebuilt at load equal the compressor's, on the real model."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.conftest import ROOT
from vkv.cli import main
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.span import compress_transcript
from vkv.errors import VkvError
from vkv.kv.file import read_header, save_cache
from vkv.kv.segment import Segment
from vkv.kv.spliced import SplicedCache
from vkv.lm.rebuild import load_cache
from vkv.text.transcript import load_transcript, render
from vkv.text.windows import select_windows

pytestmark = pytest.mark.integration

TRANSCRIPT = ROOT / "transcripts" / "dev" / "gen-ci-failure-2.json"
WINDOW, SPAN = "560", "turns:2-4"  # a ~550-token window (system + 8 messages); messages 2-4 compressed
CLI = ["--model", "smollm2-135m", "--quant", "fp32", "--window", WINDOW, "--span", SPAN, "--ratio", "4", "--steps", "2"]
# virtual tokens alone: a per-head verbatim share keeps entries no forward rebuilds
CLI += ["--method", "vkv", "--verbatim-share", "0"]


@pytest.fixture(scope="module")
def caches(smol, tmp_path_factory):
    """The same compressed cache written both ways, from one compression (the CLI's window and recipe)."""
    transcript = load_transcript(TRANSCRIPT)
    window = select_windows(transcript, render(transcript, smol.tokenizer), int(WINDOW))[0]
    ids = render(window, smol.tokenizer).ids
    torch.manual_seed(0)
    recipe = CompressConfig(verbatim_share=0.0, optim=OptimConfig(steps=2))
    spliced = compress_transcript(smol, window, (2, 5), 4, recipe)
    root = tmp_path_factory.mktemp("stores")
    kv, embeddings = root / "kv.safetensors", root / "embeddings.safetensors"
    save_cache(spliced, kv)
    save_cache(spliced, embeddings, store="embeddings", ids=ids)
    return SimpleNamespace(spliced=spliced, ids=ids, kv=kv, embeddings=embeddings, window=window)


def assert_same_cache(rebuilt: SplicedCache, reference: SplicedCache) -> None:
    assert [(s.kind, s.span) for s in rebuilt.segments] == [(s.kind, s.span) for s in reference.segments]
    assert rebuilt.next_position == reference.next_position
    for i, (a, b) in enumerate(zip(rebuilt.segments, reference.segments)):
        # the slots attention reaches: a K/V file keeps only those of a head-wise segment (its padding loads as copies)
        reach = torch.ones(b.keys.shape[:3], dtype=torch.bool) if b.bias is None else torch.isfinite(b.bias)
        torch.testing.assert_close(a.keys[reach], b.keys[reach], atol=1e-4, rtol=1e-4, msg=f"segment {i} keys")
        torch.testing.assert_close(a.values[reach], b.values[reach], atol=1e-4, rtol=1e-4, msg=f"segment {i} values")
        assert torch.equal(a.positions, b.positions)
        assert (a.bias is None) == (b.bias is None) and (a.bias is None or torch.equal(a.bias, b.bias))


def tensor_names(path) -> set[str]:
    with safe_open(str(path), framework="pt") as f:
        return set(f.keys())


def test_rebuilt_kv_equal_the_kv_file(smol, caches):
    rebuilt, reference = load_cache(caches.embeddings, smol), load_cache(caches.kv, smol)
    assert [s.kind for s in reference.segments] == ["verbatim", "virtual", "verbatim"]
    assert reference.segments[1].bias is not None  # proportional attention: the tail was fed on a biased prefix
    assert_same_cache(rebuilt, reference)
    assert rebuilt.meta == reference.meta and "store" not in rebuilt.meta
    assert not any(name.endswith((".keys", ".values")) for name in tensor_names(caches.embeddings))


def test_sequential_segments_rebuild_on_the_biased_cache_before_them(smol, caches, tmp_path):
    from vkv.api.compress import compress_with
    from vkv.compress.recipe import VkvRecipe
    from vkv.methods import get_method

    plan = VkvRecipe(CompressConfig(verbatim_share=0.0, optim=OptimConfig(steps=1)), target_source="online")
    spliced = compress_with(smol, caches.window, (2, 5), get_method("vkv", recipe=plan, per_turn=True), 4.0)
    assert [s.kind for s in spliced.segments].count("virtual") == 3
    path = tmp_path / "sequential.safetensors"
    save_cache(spliced, path, store="embeddings", ids=caches.ids)
    assert_same_cache(load_cache(path, smol), spliced)


def test_vkv_ask_answers_the_same_from_both_files(caches, capsys):
    answers = []
    for path in (caches.kv, caches.embeddings):
        question = ["--question", "With which exit code did the failing CI job end?", "--max-new-tokens", "8"]
        assert main(["ask", str(path), "--quant", "fp32", *question]) == 0
        answers.append([line for line in capsys.readouterr().out.splitlines() if line.startswith("A:")])
    assert answers[0] and answers[0] == answers[1]


def test_the_embeddings_file_is_smaller_by_the_virtual_segments_factor(smol, caches):
    """A virtual segment's bytes, float32: the kv store writes K, V and bias for the entries attention reaches (with
    head-wise shares, a share of the slots; a bool mask says which) and every slot's embedding and position; the
    embeddings store every slot's embedding and position, and the bias as one number per slot, one per layer and KV
    head, and a mask of one bit per layer, KV head and slot. Verbatim tokens shrink far more (K/V against an id)."""
    spec = smol.spec
    virtual = caches.spliced.segments[1]
    slots, real = virtual.slots, int(torch.isfinite(virtual.bias).sum())
    heads = spec.num_layers * spec.num_kv_heads
    kv = 4 * (real * (2 * spec.head_dim + 1) + slots * (spec.hidden_size + 1)) + heads * slots
    embeddings = 4 * (slots * (spec.hidden_size + 2) + heads) + -(-heads * slots // 8)

    def virtual_bytes(path) -> int:
        with safe_open(str(path), framework="pt") as f:
            return sum(f.get_tensor(n).nbytes for n in f.keys() if n.startswith("segments.1."))

    assert (virtual_bytes(caches.kv), virtual_bytes(caches.embeddings)) == (kv, embeddings)
    kv_bytes, embeddings_bytes = caches.kv.stat().st_size, caches.embeddings.stat().st_size
    # the whole file gains more than the virtual segment: its verbatim segments keep token ids instead of K/V
    assert kv_bytes / embeddings_bytes > max(8, kv / embeddings), (kv_bytes, embeddings_bytes)


def test_cli_store_flag_writes_and_inspect_reports_both_stores(smol, caches, tmp_path, capsys):
    out = tmp_path / "cli.safetensors"
    assert main(["compress", str(TRANSCRIPT), *CLI, "--store", "embeddings", "--out", str(out)]) == 0
    assert read_header(out)["store"] == "embeddings"
    with safe_open(str(out), framework="pt") as a, safe_open(str(caches.embeddings), framework="pt") as b:
        assert set(a.keys()) == set(b.keys())
        assert all(torch.equal(a.get_tensor(n), b.get_tensor(n)) for n in a.keys())  # same seed, same file
    capsys.readouterr()
    for path, store in ((caches.kv, "kv"), (caches.embeddings, "embeddings")):
        report = tmp_path / f"{store}.json"
        assert main(["inspect", str(path), "--json", str(report)]) == 0
        printed = capsys.readouterr().out
        assert "bytes_per_original_token" in printed and store in printed
        storage = json.loads(report.read_text())["storage"]
        compressed = caches.spliced.segments[1].original_tokens
        assert {k: storage[k] for k in ("store", "file_bytes", "bytes_per_original_token")} == {
            "store": store,
            "file_bytes": path.stat().st_size,
            "bytes_per_original_token": round(path.stat().st_size / compressed),
        }
        decoding = smol.ragged_cache(caches.spliced)  # either store decodes on the same cache
        start, end = caches.spliced.segments[1].span
        assert storage["memory_bytes"] == decoding.nbytes
        assert storage["compressed_memory_bytes"] == decoding.span_nbytes(start, end)
        assert storage["ratio_memory"] > 3.2  # `--ratio 4`: the memory ratio is about the entries ratio


def test_refusals_are_one_clear_sentence(smol, smol_tokenizer, caches, tmp_path, capsys):
    from tests.conftest import build_tiny

    with pytest.raises(VkvError, match="embeddings.safetensors: field store: .*a model is needed to rebuild them"):
        load_cache(caches.embeddings)
    other = build_tiny("llama", smol_tokenizer)
    with pytest.raises(VkvError, match="embeddings.safetensors: field fingerprint: cache was built for model"):
        load_cache(caches.embeddings, other)
    other_transcript = ROOT / "transcripts" / "dev" / "gen-migration-3.json"
    ask = ["ask", str(caches.embeddings), "--question", "Which job failed?", "--transcript", str(other_transcript)]
    assert main(ask) == 2
    assert "gen-migration-3.json: field sha256" in capsys.readouterr().err

    spliced = caches.spliced
    virtual = spliced.segments[1]
    compact = Segment("compact", virtual.span, virtual.keys, virtual.values, virtual.positions, bias=virtual.bias)
    hybrid = Segment(
        "virtual",
        virtual.span,
        virtual.keys,
        virtual.values,
        virtual.positions,
        virtual.embeddings,
        {"verbatim_entries": [0]},
    )
    tail = spliced.segments[2]
    oracle_tail = Segment("verbatim", tail.span, tail.keys, tail.values, tail.positions, stats={"targets": "oracle"})
    for segments, match in (
        ([spliced.segments[0], compact], r"segments\[1\]\.kind: a compact segment"),
        ([spliced.segments[0], hybrid], r"segments\[1\]: .*hybrid"),
        ([spliced.segments[0], virtual, oracle_tail], r"segments\[2\]: a turn kept verbatim under oracle targets"),
    ):
        with pytest.raises(VkvError, match=match):
            save_cache(SplicedCache(segments, meta=spliced.meta), tmp_path / "x.safetensors", "embeddings", caches.ids)
    tensors = load_file(str(caches.embeddings))
    tensors["segments.1.bias_mask"] = tensors["segments.1.bias_mask"][:-1]  # a bit mask one byte short
    with safe_open(str(caches.embeddings), framework="pt") as f:
        save_file(tensors, str(tmp_path / "short.safetensors"), metadata=f.metadata())
    with pytest.raises(VkvError, match=r"short.safetensors: field segments\[1\]\.bias_mask: a separable bias needs"):
        load_cache(tmp_path / "short.safetensors", smol)
    with pytest.raises(VkvError, match=r"segments\[0\]: .*token ids"):
        save_cache(spliced, tmp_path / "x.safetensors", store="embeddings")  # no ids for the verbatim segments
    assert not (tmp_path / "x.safetensors").exists()

    for flags, message in (
        (["--store", "values"], "--store 'values'"),
        (["--verbatim", "shared"], "cannot hold --verbatim shared"),
        (["--verbatim-share", "0.9"], "cannot hold segments with a per-head verbatim share (--verbatim-share 0.9"),
    ):
        out = tmp_path / "never.safetensors"
        assert main(["compress", str(TRANSCRIPT), *CLI, "--store", "embeddings", *flags, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and not out.exists()
