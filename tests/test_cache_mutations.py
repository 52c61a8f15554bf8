"""A cache file changed after it was written is refused with one sentence, or loads to exactly the cache it held:
every field of its header, every tensor's dtype and shape, missing and extra tensors, and truncations; and an edited
file, with its digest removed, its format version lowered or its digest recomputed, is never answered from."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tests.conftest import FIXTURES
from tests.test_ragged_cache import caches
from vkv.cli import main
from vkv.errors import VkvError
from vkv.kv.file import cache_metadata, digest, read_cache, read_header, save_cache
from vkv.lm.rebuild import load_cache


@pytest.fixture(scope="module")
def original(tiny_llama, tmp_path_factory) -> tuple[Path, object]:
    spliced = caches(tiny_llama)["mixed"]
    spliced.meta = cache_metadata(tiny_llama)
    path = tmp_path_factory.mktemp("mutations") / "original.safetensors"
    save_cache(spliced, path)
    return path, read_cache(path)


def same(a, b) -> bool:
    """Whether two loaded caches hold the same decoding state (entries, biases, positions, segment table)."""

    def equal(x, y) -> bool:
        return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))

    return (
        a.next_position == b.next_position
        and [(s.kind, tuple(s.span)) for s in a.segments] == [(s.kind, tuple(s.span)) for s in b.segments]
        and all(
            equal(x.keys, y.keys)
            and equal(x.values, y.values)
            and equal(x.positions, y.positions)
            and equal(x.bias, y.bias)
            and equal(x.embeddings, y.embeddings)
            for x, y in zip(a.segments, b.segments)
        )
    )


def leaves(node, path=()):
    """Every (path, value) of a JSON tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from leaves(value, (*path, i))
    yield path, node


def with_leaf(header: dict, path: tuple, value, delete: bool = False) -> dict:
    copy = json.loads(json.dumps(header))
    if not path:
        return value if not delete else {}
    node = copy
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return copy


def header_mutants(header: dict, rng: random.Random):
    paths = [p for p, _ in leaves(header) if p]
    for path in paths:
        for value in rng.sample([None, -1, 0, 10**9, 1.5, "x", [], {}, True], 3):
            yield f"header {'.'.join(map(str, path))} = {value!r}", with_leaf(header, path, value), None
        if isinstance(path[-1], str):
            yield f"header without {'.'.join(map(str, path))}", with_leaf(header, path, None, delete=True), None


def tensor_mutants(tensors: dict[str, torch.Tensor]):
    for name, t in tensors.items():
        rest = {k: v for k, v in tensors.items() if k != name}
        yield f"without {name}", None, rest
        for dtype in (torch.float16, torch.float64, torch.int32, torch.bool):
            if dtype != t.dtype:
                yield f"{name} as {dtype}", None, {**rest, name: t.to(dtype)}
        if t.dim() >= 2 and t.shape[0] != t.shape[-1]:
            yield f"{name} with dimensions swapped", None, {**rest, name: t.transpose(0, -1).contiguous()}
        if t.numel() > 1:
            yield f"{name} flattened", None, {**rest, name: t.reshape(-1).contiguous()}
            yield f"{name} one row short", None, {**rest, name: t[:-1].contiguous()}
        if t.is_floating_point() and t.numel():
            for bad in (float("nan"), float("inf")):
                changed = t.clone()
                changed.view(-1)[0] = bad
                yield f"{name} with {bad} first", None, {**rest, name: changed}
        yield f"an extra copy of {name}", None, {**tensors, name.replace("segments.", "segments.9", 1): t.clone()}
    yield "an unknown tensor", None, {**tensors, "notes": torch.zeros(3)}


def test_every_mutant_is_refused_or_loads_to_the_original(original, tmp_path):
    path, cache = original
    header, tensors = read_header(path), load_file(str(path))
    rng = random.Random(0)
    refused = identical = 0
    mutants = list(header_mutants(header, rng)) + list(tensor_mutants(tensors))
    assert len(mutants) > 300
    for label, new_header, new_tensors in mutants:
        target = tmp_path / "mutant.safetensors"
        metadata = {"vkv": json.dumps(header if new_header is None else new_header)}
        save_file(tensors if new_tensors is None else new_tensors, str(target), metadata=metadata)
        try:
            loaded = read_cache(target)
        except VkvError as exc:
            message = str(exc)
            assert "\n" not in message and str(target) in message and "field" in message, (label, message)
            refused += 1
            continue
        assert same(loaded, cache), f"{label}: loaded to another cache"
        identical += 1
    assert refused > 200 and identical > 10  # statistics and labels may change; anything decoding reads may not


def test_truncated_files_are_refused(original, tmp_path):
    path, _ = original
    data = path.read_bytes()
    for cut in (1, 8, 100, len(data) // 2, len(data) - 1):
        target = tmp_path / f"cut{cut}.safetensors"
        target.write_bytes(data[:cut])
        with pytest.raises(VkvError, match=str(target)) as err:
            read_cache(target)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("mutation", ["segments one short", "negative next_position", "NaN position", "fp16 keys"])
def test_inspect_refuses_corruption_in_one_sentence(original, tmp_path, capsys, mutation):
    """What the hostile-input report found answered from: `vkv inspect` now checks the tensors, not only the header."""
    path, _ = original
    header, tensors = read_header(path), load_file(str(path))
    if mutation == "segments one short":
        header["segments"] = header["segments"][:-1]
    elif mutation == "negative next_position":
        header["next_position"] = -1
    elif mutation == "NaN position":
        tensors["segments.1.positions"][0] = float("nan")
    else:
        tensors["segments.0.keys"] = tensors["segments.0.keys"].half()
    target = tmp_path / "bad.safetensors"
    save_file(tensors, str(target), metadata={"vkv": json.dumps(header)})
    assert main(["inspect", str(target)]) == 2
    err = capsys.readouterr().err
    assert "field" in err and "Traceback" not in err and err.count("error:") == 1


# Edited files as an attacker would write them: the header's integrity fields removed or lowered, and every tensor kind
# edited with the digest recomputed by the file module's own function, so only the checks beyond the digest (format
# versions, the table's counts, and the entries' plausibility for the model) stand between the edit and an answer.
# Each is loaded with the model through `vkv ask`.

TRANSCRIPT = FIXTURES / "mini-agent.json"
MODEL = ["--model", "smollm2-135m", "--quant", "fp32"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Real caches of the test model: am's (verbatim keys and values, a compact segment stored flat with fitted
    biases) and virtual tokens' embeddings-only file (ids, embeddings, a separable bias with its bit mask)."""
    root = tmp_path_factory.mktemp("built")
    kv, embeddings = root / "am.safetensors", root / "virtual.safetensors"
    assert main(["compress", str(TRANSCRIPT), *MODEL, "--method", "am", "--ratio", "4", "--out", str(kv)]) == 0
    recipe = ["--ratio", "4", "--verbatim-share", "0", "--steps", "2", "--store", "embeddings"]
    assert main(["compress", str(TRANSCRIPT), *MODEL, *recipe, "--out", str(embeddings)]) == 0
    return {"kv": kv, "embeddings": embeddings}


def scale(factor: float, *fields: str):
    def edit(header, tensors):
        for name in [n for n in tensors if n.rsplit(".", 1)[-1] in fields]:
            tensors[name] = tensors[name] * factor

    return edit


def header_field(**changes):
    def edit(header, tensors):
        for key, value in changes.items():
            if value is None:
                header.pop(key, None)
            else:
                header[key] = value

    return edit


def both(*edits):
    def edit(header, tensors):
        for e in edits:
            e(header, tensors)

    return edit


def flip_mask(name: str):
    def edit(header, tensors):
        for key in [n for n in tensors if n.endswith(f".{name}")]:
            t = tensors[key]
            tensors[key] = ~t if t.dtype == torch.bool else (255 - t).to(torch.uint8)

    return edit


def shuffle_positions(segment_kind: str):
    """Positions of the first segment of `segment_kind` permuted within its span (the same set of positions)."""

    def edit(header, tensors):
        i = next(i for i, row in enumerate(header["segments"]) if row["kind"] == segment_kind)
        positions = tensors[f"segments.{i}.positions"]
        order = torch.randperm(positions.numel(), generator=torch.Generator().manual_seed(0))
        tensors[f"segments.{i}.positions"] = positions[order].contiguous()

    return edit


VALUES = ("values", "values_real")
KEYS = ("keys", "keys_real")
NOT_CAUGHT = pytest.mark.xfail(
    strict=True,
    reason="documented, not caught: a sign flip keeps every magnitude, and no check short of the model's own "
    "outputs on the original text tells flipped values from real ones (README: what the checks do not promise)",
)

# (label, which file, edit, whether the digest is recomputed after the edit)
CAUGHT = [
    ("digest removed", "kv", header_field(digest=None), False),
    ("digest removed from the embeddings file", "embeddings", header_field(digest=None), False),
    ("version lowered to 4, digest kept", "kv", header_field(format_version=4), False),
    ("version lowered to 3, digest kept", "kv", header_field(format_version=3), False),
    ("version lowered to 3, digest removed", "embeddings", header_field(format_version=3, digest=None), False),
    (
        "version lowered to 4, digest removed, values ×1e6",
        "kv",
        both(header_field(format_version=4, digest=None), scale(1e6, *VALUES)),
        False,
    ),
    ("values ×1e6", "kv", scale(1e6, *VALUES), True),
    ("values ÷1e6", "kv", scale(1e-6, *VALUES), True),
    ("values zeroed", "kv", scale(0.0, *VALUES), True),
    ("fitted values ×1e6", "kv", scale(1e6, "values_real"), True),
    ("fitted values zeroed", "kv", scale(0.0, "values_real"), True),
    ("keys ×1e6", "kv", scale(1e6, *KEYS), True),
    ("fitted keys ÷1e6", "kv", scale(1e-6, "keys_real"), True),
    ("keys ÷1e6", "kv", scale(1e-6, *KEYS), True),
    ("fitted biases ×1e6", "kv", scale(1e6, "bias_real"), True),
    ("flat real mask flipped", "kv", flip_mask("real"), True),
    ("verbatim positions shuffled", "kv", shuffle_positions("verbatim"), True),
    ("embeddings ×1e6", "embeddings", scale(1e6, "embeddings"), True),
    ("embeddings zeroed", "embeddings", scale(0.0, "embeddings"), True),
    ("per-head biases ×1e6", "embeddings", scale(1e6, "bias_per_head"), True),
    ("bias mask bits flipped", "embeddings", flip_mask("bias_mask"), True),
    ("virtual positions shuffled", "embeddings", shuffle_positions("virtual"), True),
]
EDITS = [pytest.param(*e, id=e[0]) for e in CAUGHT] + [
    pytest.param("values sign-flipped", "kv", scale(-1.0, *VALUES), True, marks=NOT_CAUGHT, id="values sign-flipped")
]


@pytest.mark.parametrize("label, which, edit, rehash", EDITS)
def test_an_edited_file_is_never_answered_from(built, smol, tmp_path, monkeypatch, capsys, label, which, edit, rehash):
    source = built[which]
    with safe_open(str(source), framework="pt") as f:
        header = json.loads(f.metadata()["vkv"])
    tensors = load_file(str(source))
    edit(header, tensors)
    if rehash:
        header["digest"] = digest(header, tensors)
    target = tmp_path / "edited.safetensors"
    save_file(tensors, str(target), metadata={"vkv": json.dumps(header)})
    monkeypatch.setattr("vkv.cli.ask.load_model_from", lambda config: smol)
    capsys.readouterr()
    code = main(["ask", str(target), "--question", "Which CI job failed?", "--max-new-tokens", "2"])
    out, err = capsys.readouterr()
    print(label, "→", err.strip())  # which check refused it, for the record of a -s run
    assert code == 2, f"{label}: answered {out!r}"
    assert "A:" not in out and "Traceback" not in err and err.count("error:") == 1, (label, err)
    assert str(target) in err and "field" in err, (label, err)


def test_the_unedited_files_answer_and_inspect_names_their_integrity(built, smol, monkeypatch, capsys):
    monkeypatch.setattr("vkv.cli.ask.load_model_from", lambda config: smol)
    for path in built.values():
        assert main(["ask", str(path), "--question", "Which CI job failed?", "--max-new-tokens", "2"]) == 0
        assert "A:" in capsys.readouterr().out
        assert main(["inspect", str(path)]) == 0
        assert "sha256 digest verified" in capsys.readouterr().out


def test_a_genuinely_older_file_loads_named_unverified(built, smol, tmp_path, capsys):
    """A version 4 file written before the digest (no newer field) still loads; inspect says it is unverified."""
    with safe_open(str(built["kv"]), framework="pt") as f:
        header = json.loads(f.metadata()["vkv"])
    header["format_version"] = 4
    del header["digest"]
    target = tmp_path / "v4.safetensors"
    save_file(load_file(str(built["kv"])), str(target), metadata={"vkv": json.dumps(header)})
    assert same(load_cache(target, smol), load_cache(built["kv"], smol))
    assert main(["inspect", str(target)]) == 0
    assert "unverified: format version 4 predates the digest" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "window, message",
    [([5, 2], "transcript.window"), ([0, 10**9], "transcript.window"), ([0, 1e9], "transcript.window")],
)
def test_a_window_that_names_no_messages_is_refused(built, tmp_path, window, message):
    with safe_open(str(built["kv"]), framework="pt") as f:
        header = json.loads(f.metadata()["vkv"])
    header["transcript"]["window"] = window
    target = tmp_path / "window.safetensors"
    save_file(load_file(str(built["kv"])), str(target), metadata={"vkv": json.dumps(header)})
    with pytest.raises(VkvError, match=message):
        read_header(target)


@pytest.mark.parametrize("command", ["ask", "inspect"])
def test_deeply_nested_metadata_is_one_sentence(built, tmp_path, capsys, command):
    with safe_open(str(built["kv"]), framework="pt") as f:
        raw = f.metadata()["vkv"]
    target = tmp_path / "nested.safetensors"
    nested = raw[:-1] + ', "notes": ' + "[" * 100_000 + "]" * 100_000 + "}"
    save_file(load_file(str(built["kv"])), str(target), metadata={"vkv": nested})
    argv = ["ask", str(target), "--question", "q"] if command == "ask" else ["inspect", str(target)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "nests" in err and "Traceback" not in err and err.count("error:") == 1


@pytest.mark.parametrize("kind", ["/dev/zero", "directory", "fifo"])
def test_a_cache_path_that_is_no_regular_file_is_one_sentence(tmp_path, capsys, kind):
    import os

    if kind == "/dev/zero":
        path = Path("/dev/zero")
    elif kind == "directory":
        path = tmp_path
    else:
        path = tmp_path / "pipe"
        os.mkfifo(path)
    for argv in (["inspect", str(path)], ["ask", str(path), "--question", "q"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "not a regular file" in err and "Traceback" not in err and err.count("error:") == 1
