"""A cache file changed after it was written is refused with one sentence, or loads to exactly the cache it held:
every field of its header, every tensor's dtype and shape, missing and extra tensors, and truncations."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.test_ragged_cache import caches
from vkv.cli import main
from vkv.errors import VkvError
from vkv.kv.file import cache_metadata, read_cache, read_header, save_cache


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
