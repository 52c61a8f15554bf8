"""A cache file changed after it was written is refused with one sentence: every field of its header, every tensor's
dtype and shape, missing and extra tensors, and truncations; an edited file, with its digest removed, its format
version lowered or its digest recomputed, is never answered from; a file signed with another user's key loads only
when trusted (`--trust-foreign`), and then every change that is not refused loads to exactly the cache it held."""

from __future__ import annotations

import json
import os
import random
import re
import stat
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
from vkv.kv.sign import key_id, key_path, sign
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


def unchanged(header, tensors, new_header, new_tensors) -> bool:
    """Whether a mutant is the file itself (a 1-D tensor "flattened", a field set to the value it had)."""
    return new_header in (None, header) and (
        new_tensors is None
        or (
            new_tensors.keys() == tensors.keys()
            and all(
                t.dtype == tensors[n].dtype and t.shape == tensors[n].shape and torch.equal(t, tensors[n])
                for n, t in new_tensors.items()
            )
        )
    )


@pytest.mark.parametrize("trust_foreign", [False, True], ids=["signed", "trusted"])
def test_every_mutant_is_refused_or_loads_to_the_original(original, tmp_path, trust_foreign):
    """Signed: every change to the file is refused (the signature covers the whole header). Trusted, where only the
    digest and the checks vouch for the file: statistics and labels may change; anything decoding reads may not."""
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
            loaded = read_cache(target, trust_foreign=trust_foreign)
        except VkvError as exc:
            message = str(exc)
            assert "\n" not in message and str(target) in message and "field" in message, (label, message)
            refused += 1
            continue
        assert same(loaded, cache), f"{label}: loaded to another cache"
        assert trust_foreign or unchanged(header, tensors, new_header, new_tensors), f"{label}: an edit loaded"
        identical += 1
    assert refused > 200 and (identical > 10 if trust_foreign else refused + identical == len(mutants))


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


# Edited files as an attacker without the user's key would write them: the header's integrity fields removed or
# lowered, and every tensor kind edited with the digest recomputed by the file module's own function (and the file
# signed again with the attacker's own key). The signature refuses them all; with --trust-foreign, which skips it, the
# checks beyond the digest (format versions, the table's counts, the entries' plausibility for the model) still refuse
# every edit that changes magnitudes. Each is loaded with the model through `vkv ask`.

TRANSCRIPT = FIXTURES / "mini-agent.json"
MODEL = ["--model", "smollm2-135m", "--quant", "fp32"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Real caches of the test model: am's (verbatim keys and values, a compact segment stored flat with fitted
    biases) and virtual tokens' embeddings-only file (ids, embeddings, a separable bias with its bit mask)."""
    root = tmp_path_factory.mktemp("built")
    kv, embeddings = root / "am.safetensors", root / "virtual.safetensors"
    assert main(["compress", str(TRANSCRIPT), *MODEL, "--method", "am", "--ratio", "4", "--out", str(kv)]) == 0
    recipe = ["--method", "vkv", "--ratio", "4", "--verbatim-share", "0", "--steps", "2", "--store", "embeddings"]
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


def shuffle_entries(segment_kind: str):
    """The entries of the first segment of `segment_kind` permuted among its slots, their positions left in place:
    every magnitude kept, each slot holding another token's keys and values (or embedding)."""

    def edit(header, tensors):
        i = next(i for i, row in enumerate(header["segments"]) if row["kind"] == segment_kind)
        generator = torch.Generator().manual_seed(0)
        for names, dim in (
            (("keys", "values"), 2),
            (("keys_real", "values_real", "bias_real"), 0),
            (("embeddings",), 0),
        ):
            present = [f"segments.{i}.{n}" for n in names if f"segments.{i}.{n}" in tensors]
            if present:
                order = torch.randperm(tensors[present[0]].shape[dim], generator=generator)
                for name in present:
                    tensors[name] = tensors[name].index_select(dim, order).contiguous()

    return edit


def retarget(path: str):
    def edit(header, tensors):
        header["transcript"]["path"] = path

    return edit


def resign(header, tensors):
    """An attacker's own key signs the edited file (written in the test's other home, so not the user's key)."""
    header.update(sign({k: v for k, v in header.items() if k not in ("key_id", "signature")}))


VALUES = ("values", "values_real")
KEYS = ("keys", "keys_real")

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
# edits that keep every magnitude: only the signature tells them from the file written
SIGNATURE_ONLY = [
    ("values sign-flipped", "kv", scale(-1.0, *VALUES), True),
    ("keys sign-flipped", "kv", scale(-1.0, *KEYS), True),
    ("fitted values sign-flipped", "kv", scale(-1.0, "values_real"), True),
    ("verbatim entries shuffled within their span", "kv", shuffle_entries("verbatim"), True),
    ("fitted entries shuffled within their span", "kv", shuffle_entries("compact"), True),
    ("virtual embeddings shuffled within their span", "embeddings", shuffle_entries("virtual"), True),
    ("embeddings sign-flipped", "embeddings", scale(-1.0, "embeddings"), True),
    (
        "values sign-flipped, version lowered to 5, signature removed",
        "kv",
        both(header_field(format_version=5, key_id=None, signature=None), scale(-1.0, *VALUES)),
        True,
    ),
    ("values sign-flipped, re-signed with another key", "kv", scale(-1.0, *VALUES), "resign"),
    ("transcript path changed (the digest does not cover it)", "kv", retarget("/tmp/another.json"), False),
    ("transcript path changed, re-signed with another key", "kv", retarget("/tmp/another.json"), "resign"),
]


def edited(source: Path, edit, rehash, target: Path, elsewhere: Path, monkeypatch) -> Path:
    """`source` edited into `target`, its digest recomputed when `rehash` (and signed with a key made in the home
    `elsewhere` when it is "resign")."""
    with safe_open(str(source), framework="pt") as f:
        header = json.loads(f.metadata()["vkv"])
    tensors = load_file(str(source))
    edit(header, tensors)
    if rehash:
        header["digest"] = digest(header, tensors)
    if rehash == "resign":
        with monkeypatch.context() as patch:
            patch.setenv("VKV_HOME", str(elsewhere))
            resign(header, tensors)
    save_file(tensors, str(target), metadata={"vkv": json.dumps(header)})
    return target


@pytest.mark.parametrize(
    "label, which, edit, rehash, trust",
    [pytest.param(*e, False, id=e[0]) for e in CAUGHT + SIGNATURE_ONLY]
    + [pytest.param(*e, True, id=f"{e[0]}, trusted") for e in CAUGHT],
)
def test_an_edited_file_is_never_answered_from(
    built, smol, tmp_path, monkeypatch, capsys, label, which, edit, rehash, trust
):
    target = edited(built[which], edit, rehash, tmp_path / "edited.safetensors", tmp_path / "other", monkeypatch)
    monkeypatch.setattr("vkv.cli.ask.load_model_from", lambda config: smol)
    capsys.readouterr()
    argv = ["ask", str(target), "--question", "Which CI job failed?", "--max-new-tokens", "2"]
    code = main(argv + ["--trust-foreign"] * trust)
    out, err = capsys.readouterr()
    print(label, "→", err.strip())  # which check refused it, for the record of a -s run
    assert code == 2, f"{label}: answered {out!r}"
    assert "A:" not in out and "Traceback" not in err and err.count("error:") == 1, (label, err)
    assert str(target) in err and "field" in err, (label, err)
    if (label, which, edit, rehash) in SIGNATURE_ONLY:  # refused for its signature, which the opt-in would skip
        assert "--trust-foreign" in err, err


def test_the_unedited_files_answer_and_inspect_names_their_integrity(built, smol, monkeypatch, capsys):
    monkeypatch.setattr("vkv.cli.ask.load_model_from", lambda config: smol)
    for path in built.values():
        assert main(["ask", str(path), "--question", "Which CI job failed?", "--max-new-tokens", "2"]) == 0
        assert "A:" in capsys.readouterr().out
        assert main(["inspect", str(path)]) == 0
        assert "signed with your key; sha256 digest verified" in " ".join(capsys.readouterr().out.split())


def test_a_genuinely_older_file_loads_named_unverified_when_trusted(built, smol, tmp_path, capsys):
    """A version 4 file written before the digest and signatures (no newer field) cannot be told from one edited and
    lowered to version 4, so it loads only when trusted; inspect then says it is unverified."""
    with safe_open(str(built["kv"]), framework="pt") as f:
        header = json.loads(f.metadata()["vkv"])
    header["format_version"] = 4
    for name in ("digest", "key_id", "signature"):
        del header[name]
    target = tmp_path / "v4.safetensors"
    save_file(load_file(str(built["kv"])), str(target), metadata={"vkv": json.dumps(header)})
    with pytest.raises(VkvError, match="field signature: none, as format version 4 predates signed caches"):
        load_cache(target, smol)
    assert same(load_cache(target, smol, trust_foreign=True), load_cache(built["kv"], smol))
    assert main(["inspect", str(target)]) == 2
    assert "--trust-foreign" in capsys.readouterr().err
    assert main(["inspect", str(target), "--trust-foreign"]) == 0
    assert "unverified: format version 4 predates the digest" in " ".join(capsys.readouterr().out.split())


@pytest.fixture
def foreign(built, tmp_path, monkeypatch) -> Path:
    """The am cache as another user would have written it: loaded (trusted) and saved under another home's key."""
    target = tmp_path / "foreign.safetensors"
    with monkeypatch.context() as patch:
        patch.setenv("VKV_HOME", str(tmp_path / "other-user"))
        save_cache(read_cache(built["kv"], trust_foreign=True), target)
    return target


def test_a_file_signed_with_another_key_loads_only_when_trusted(built, foreign, smol, monkeypatch, capsys):
    with pytest.raises(
        VkvError, match=rf"{re.escape(str(foreign))}: field key_id: signed with another key .*--trust-foreign"
    ):
        load_cache(foreign, smol)
    assert same(load_cache(foreign, smol, trust_foreign=True), load_cache(built["kv"], smol))
    with pytest.raises(VkvError, match="trust_foreign: expected True or False"):
        load_cache(foreign, smol, trust_foreign="yes")

    def no_model(config):
        raise AssertionError("a model was loaded for a file that is refused")

    for command in ("ask", "chat", "eval"):  # each refuses before any model loads
        monkeypatch.setattr(f"vkv.cli.{command}.load_model_from", no_model)
    ask = ["ask", str(foreign), "--question", "Which CI job failed?", "--max-new-tokens", "2"]
    evaluate = ["eval", str(TRANSCRIPT), *MODEL, "--method", "none", "--cache", str(foreign)]
    for argv in (ask, ["inspect", str(foreign)], ["chat", str(foreign)], evaluate):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "field key_id" in err and "--trust-foreign" in err and err.count("error:") == 1, err
    monkeypatch.setattr("vkv.cli.ask.load_model_from", lambda config: smol)
    assert main([*ask, "--trust-foreign"]) == 0
    assert "A:" in capsys.readouterr().out
    assert main(["inspect", str(foreign), "--trust-foreign"]) == 0
    assert "trusted with --trust-foreign, its key_id: signed with another key" in " ".join(
        capsys.readouterr().out.split()
    )


def test_the_key_is_made_once_private_and_never_replaced(original, tmp_path, monkeypatch):
    monkeypatch.setenv("VKV_HOME", str(tmp_path / "home"))
    _, cache = original
    assert not key_path().exists()
    umask = os.umask(0)  # the most permissive umask: the key is private anyway
    try:
        save_cache(cache, tmp_path / "a.safetensors")
    finally:
        os.umask(umask)
    key = key_path().read_bytes()
    assert stat.S_IMODE(key_path().stat().st_mode) == 0o600
    save_cache(cache, tmp_path / "b.safetensors")
    assert key_path().read_bytes() == key
    assert read_header(tmp_path / "b.safetensors")["key_id"] == key_id(bytes.fromhex(key.decode()))
    assert "cache-signing" not in json.dumps(read_header(tmp_path / "b.safetensors"))  # the header names no key file


def test_a_key_made_meanwhile_by_another_process_is_kept(original, tmp_path, monkeypatch):
    monkeypatch.setenv("VKV_HOME", str(tmp_path))
    theirs = bytes(range(32))
    link = os.link

    def another_process_first(source, target):
        Path(target).write_text(theirs.hex() + "\n")
        os.chmod(target, 0o600)
        link(source, target)

    monkeypatch.setattr(os, "link", another_process_first)
    save_cache(original[1], tmp_path / "c.safetensors")
    assert key_path().read_text() == theirs.hex() + "\n"
    assert read_header(tmp_path / "c.safetensors")["key_id"] == key_id(theirs)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


@pytest.mark.parametrize("damage", ["open to others", "not a key"])
def test_a_key_file_others_could_use_or_that_is_damaged_is_refused(original, tmp_path, monkeypatch, damage):
    monkeypatch.setenv("VKV_HOME", str(tmp_path))
    save_cache(original[1], tmp_path / "d.safetensors")
    if damage == "open to others":
        key_path().chmod(0o644)
        message = "open to other users .* chmod 600"
    else:
        key_path().write_text("not hex\n")
        message = "damaged"
    for act in (
        lambda: save_cache(original[1], tmp_path / "e.safetensors"),
        lambda: read_cache(tmp_path / "d.safetensors"),
    ):
        with pytest.raises(VkvError, match=rf"{re.escape(str(key_path()))}: the cache signing key .*{message}"):
            act()


def test_ask_refuses_json_onto_the_transcript_the_cache_records(built, tmp_path, capsys):
    """The recorded transcript is what ask reads (and the only text the cache can be checked against)."""
    copy = tmp_path / "transcript.json"
    copy.write_bytes(TRANSCRIPT.read_bytes())
    with safe_open(str(built["kv"]), framework="pt") as f:
        header = json.loads(f.metadata()["vkv"])
    header["transcript"]["path"] = str(copy)
    target = tmp_path / "recorded.safetensors"
    save_file(load_file(str(built["kv"])), str(target), metadata={"vkv": json.dumps(sign(header))})
    assert main(["ask", str(target), "--question", "q", "--json", str(copy)]) == 2
    err = capsys.readouterr().err
    assert "field --json: that is the transcript the cache records" in err and err.count("error:") == 1
    assert copy.read_bytes() == TRANSCRIPT.read_bytes()


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
