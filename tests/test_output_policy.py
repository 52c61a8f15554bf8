"""One output policy for every command and writer (vkv.io.check_output): an output is a regular file or nothing yet,
never a device, FIFO, directory or link, never an input, another output, a file in the model's directory or what vkv
keeps in its home; and everything that could fail after the work (the signing key, the output's name) fails before
the model loads. Each refusal is one sentence, and every file that was there before is left as it was."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from tests.report_helpers import line
from vkv.cli import main
from vkv.errors import VkvError

TRANSCRIPT = FIXTURES / "mini-agent.json"


def never_load(config):
    raise AssertionError("the model was loaded before a refusal that needs no model")


@pytest.fixture
def no_model(monkeypatch):
    """Compression refused before its model loads: loading it fails the test."""
    monkeypatch.setattr("vkv.cli.compress.load_model_from", never_load)


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh $VKV_HOME of the test's own, with a models directory (no model in it)."""
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    monkeypatch.setenv("VKV_HOME", str(home))
    return home


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every entry under `roots` as it is: a link's target, a file's size and bytes, a FIFO's or device's mode."""
    found = {}
    for root in roots:
        for path in [root, *root.rglob("*")] if root.is_dir() and not root.is_symlink() else [root]:
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                found[str(path)] = ("link", os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                small = info.st_size < 2**20  # a huge (sparse) file is known by its size: reading it is what is tested
                found[str(path)] = ("file", info.st_size, path.read_bytes() if small else None)
            else:
                found[str(path)] = ("node", stat.S_IFMT(info.st_mode), info.st_rdev)
    return found


def refused(argv: list[str], capsys, *needles: str) -> str:
    """Run `vkv argv`; it must exit 2 with one error sentence holding every needle."""
    code = main([str(a) for a in argv])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and err.count("error:") == 1 and "Traceback" not in err, (argv, err)
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def hostile_output(tmp: Path, kind: str) -> Path:
    """An existing path that is no regular file, of `kind`; the test's own, so nothing outside it is at stake."""
    path = tmp / f"out-{kind}"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        try:  # a node of its own for /dev/null's device, which a write over it would replace
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("making a device node needs privileges")
    elif kind == "link":
        (tmp / "linked.json").write_text('{"mine": true}\n')
        path.symlink_to(tmp / "linked.json")
    elif kind == "dangling-link":
        path.symlink_to(tmp / "nowhere.json")
    else:
        path.mkdir()
        (path / "inside.txt").write_text("kept\n")
    return path


KINDS = ["fifo", "device", "link", "dangling-link", "directory"]
WORDS = {"fifo": "a FIFO", "device": "a device", "link": "symbolic link", "dangling-link": "symbolic link"}


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "directory"])  # a directory --json: test_hostile_inputs
def test_a_json_output_that_is_no_regular_file_is_refused_and_left_as_it_was(tmp_path, capsys, test_model_dir, kind):
    target = hostile_output(tmp_path, kind)
    before = snapshot(tmp_path)
    refused(
        ["render", TRANSCRIPT, "--model", test_model_dir, "--json", target], capsys, str(target), "--json", WORDS[kind]
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", KINDS)
def test_python_writers_refuse_what_is_no_regular_file(tmp_path, kind):
    """The Python API's writers hold to the same rule: a link is never replaced, nor followed onto its target."""
    from vkv.io import write_json_atomic, write_text_atomic
    from vkv.kv.file import save_cache
    from vkv.kv.spliced import SplicedCache
    from vkv.sweep.results import ResultsFile

    target = hostile_output(tmp_path, kind)
    before = snapshot(tmp_path)
    for write in (
        lambda: write_json_atomic(target, {"x": 1}),
        lambda: write_text_atomic(target, "text\n"),
        lambda: save_cache(SplicedCache(), target),
        lambda: ResultsFile(target),  # a sweep's results, appended to
    ):
        with pytest.raises(VkvError, match=f"{target}: field (path|--out): "):
            write()
    assert snapshot(tmp_path) == before


def test_out_and_json_onto_one_file_are_refused_before_the_model_loads(tmp_path, capsys, test_model_dir, no_model):
    both = tmp_path / "both"
    refused(
        ["compress", TRANSCRIPT, "--model", test_model_dir, "--out", both, "--json", tmp_path / "." / "both"],
        capsys,
        str(both),
        "--json names the same file",
    )
    assert not both.exists()


def model_copy(tmp: Path, test_model_dir: Path) -> tuple[Path, Path]:
    """A model directory as the Hugging Face cache lays one out: its weights a link to a blob elsewhere."""
    model, blobs = tmp / "snapshot", tmp / "blobs"
    model.mkdir()
    blobs.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(test_model_dir / name, model)
    (blobs / "0123abcd").write_bytes(b"the weights")
    (model / "model.safetensors").symlink_to(blobs / "0123abcd")
    return model, blobs


def test_out_onto_a_model_directorys_linked_weights_is_refused(tmp_path, capsys, test_model_dir, no_model):
    model, blobs = model_copy(tmp_path, test_model_dir)
    before = snapshot(model, blobs)
    weights = model / "model.safetensors"
    refused(
        ["compress", TRANSCRIPT, "--model", model, "--quant", "fp32", "--out", weights, "--force"],
        capsys,
        str(weights),
        "--out",
    )
    assert snapshot(model, blobs) == before


def test_what_vkv_keeps_in_its_home_is_no_output_even_with_force(tmp_path, capsys, test_model_dir, home):
    from vkv.kv.sign import key_path, own_key

    own_key(create=True)
    before = snapshot(key_path(), home / "models")
    for target, what in ((key_path(), "your cache signing key"), (home / "models" / "x.json", "the fetched models")):
        argv = ["render", TRANSCRIPT, "--model", test_model_dir, "--json", target, "--force"]
        refused(argv, capsys, str(target), "--json", what)
    assert snapshot(key_path(), home / "models") == before


def test_import_out_over_an_existing_file_needs_force(tmp_path, capsys):
    conversation = tmp_path / "openai.json"
    conversation.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]))
    mine = tmp_path / "mine.json"
    mine.write_bytes(TRANSCRIPT.read_bytes())  # a transcript, maybe with questions added by hand
    refused(["import", conversation, "--out", mine], capsys, str(mine), "--out", "--force")
    assert mine.read_bytes() == TRANSCRIPT.read_bytes()
    assert main(["import", str(conversation), "--out", str(mine), "--force"]) == 0
    assert json.loads(mine.read_text())["messages"][1]["content"] == "yo"


def test_report_out_over_a_users_report_needs_force(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    (sweep / "report").mkdir(parents=True)
    lines = [line("f", "full", None, [True, True]), line("v", "vkv", 2.0, [True, False], pooling="uniform")]
    (sweep / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    notes = sweep / "report" / "report.md"
    notes.write_text("# My notes on this sweep\n")
    refused(["report", sweep], capsys, str(notes), "--out", "--force")
    assert notes.read_text() == "# My notes on this sweep\n"
    assert main(["report", str(sweep), "--force"]) == 0
    written = notes.read_text()
    assert written.startswith("# Sweep report: ")
    assert main(["report", str(sweep)]) == 0, "vkv's own report.md is replaced without --force"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name", ["", "a" * 245 + ".safetensors"])
def test_an_empty_or_overlong_output_name_is_refused_before_the_model_loads(
    tmp_path, capsys, test_model_dir, no_model, name
):
    target = str(tmp_path / name) if name else ""
    refused(["compress", TRANSCRIPT, "--model", test_model_dir, "--out", target], capsys, "--out")
    assert sorted(tmp_path.iterdir()) == []


def break_key(home: Path, problem: str, monkeypatch) -> Path:
    """`home`'s signing key with `problem`; returns the path the sentence must name."""
    from vkv.kv.sign import key_path

    key = key_path()
    if problem == "dangling link":
        key.symlink_to(home.parent / "gone.key")
    elif problem == "link out of home":
        outside = home.parent / "outside.key"
        outside.write_text("ab" * 32 + "\n")
        outside.chmod(0o600)
        key.symlink_to(outside)
    elif problem == "oversized":
        with open(key, "wb") as f:
            f.truncate(3 * 2**30)  # sparse: 3 GB to a reader, nothing on disk
        key.chmod(0o600)
    elif problem == "open to others":
        key.write_text("ab" * 32 + "\n")
        key.chmod(0o644)
    elif problem == "cannot be made":
        monkeypatch.setenv("VKV_HOME", "/proc/vkv-home")  # no process, root included, may make a directory there
        return key_path()
    else:  # home is a file
        shutil.rmtree(home)
        home.write_text("not a directory\n")
        return home
    return key


KEY_PROBLEMS = ["dangling link", "link out of home", "oversized", "open to others", "cannot be made", "home is a file"]


@pytest.mark.parametrize("problem", KEY_PROBLEMS)
def test_a_key_that_could_not_sign_is_refused_before_the_model_loads(
    tmp_path, capsys, test_model_dir, home, no_model, monkeypatch, problem
):
    named = break_key(home, problem, monkeypatch)
    parsers = str(home / "cache")  # where the CLI keeps its parser's description: rewritten at will

    def kept() -> dict:
        return {path: entry for path, entry in snapshot(tmp_path).items() if not path.startswith(parsers)}

    before = kept()
    out = tmp_path / "c.safetensors"
    refused(["compress", TRANSCRIPT, "--model", test_model_dir, "--quant", "fp32", "--out", out], capsys, str(named))
    assert kept() == before


def test_a_key_file_is_read_with_a_limit(home):
    """A huge file in the key's place is refused from its size, not read whole."""
    import tracemalloc

    from vkv.kv.sign import key_path, own_key

    with open(key_path(), "wb") as f:
        f.truncate(256 * 2**20)  # sparse; a whole read would take 256 MB
    key_path().chmod(0o600)
    tracemalloc.start()
    try:
        with pytest.raises(VkvError, match=r"damaged .* 268435456 bytes"):
            own_key()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"{peak / 2**20:.0f} MB read"


def test_an_empty_vkv_home_is_unset(tmp_path, monkeypatch):
    from vkv.home import vkv_home
    from vkv.kv.sign import key_path

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("VKV_HOME", "")
    monkeypatch.chdir(tmp_path)
    assert vkv_home() == tmp_path / ".cache" / "vkv"
    assert key_path().parent == tmp_path / ".cache" / "vkv"
