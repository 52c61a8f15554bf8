"""`vkv chat` from a pipe: answers only, each exchange appended, /save writes a session that chat continues."""

import io

import pytest

from tests.conftest import FIXTURES
from vkv.api.session import Session
from vkv.cli import main


def _chat(monkeypatch, capsys, lines, *args):
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    code = main(["chat", *map(str, args), "--model", "smollm2-135m", "--quant", "fp32", "--max-new-tokens", "8"])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


@pytest.mark.integration
def test_chat_from_a_pipe_answers_saves_and_resumes(smol, monkeypatch, capsys, tmp_path):
    saved = tmp_path / "chat.safetensors"
    code, out, _ = _chat(
        monkeypatch,
        capsys,
        ["Which library hashes passwords?", f"/save {saved}"],
        FIXTURES / "mini-agent.json",
        "--compress-every",
        "2",
    )
    assert code == 0 and len(out) == 2 and out[0].strip() and out[1] == f"saved {saved}"
    session = Session.load(saved, smol)
    assert [m.role for m in session.messages[-2:]] == ["user", "assistant"]  # the exchange was appended
    assert any(s.kind == "compact" for s in session.cache.segments)  # and compressed after 2 messages
    code, out, _ = _chat(monkeypatch, capsys, ["Which test runner is used?"], saved)
    assert code == 0 and len(out) == 1 and out[0].strip()


@pytest.mark.integration
def test_chat_continues_a_compressed_transcripts_cache(smol, tmp_path, monkeypatch, capsys):
    from vkv.compress.config import CompressConfig
    from vkv.compress.optimise import OptimConfig
    from vkv.compress.span import compress_transcript
    from vkv.kv.file import save_cache
    from vkv.text.transcript import load_transcript

    transcript = load_transcript(FIXTURES / "mini-agent.json")
    spliced = compress_transcript(smol, transcript, (1, 3), 3.2, CompressConfig(optim=OptimConfig(steps=1)))
    save_cache(spliced, tmp_path / "c.safetensors")
    code, out, _ = _chat(
        monkeypatch, capsys, ["Which library hashes passwords?", "And the test runner?"], tmp_path / "c.safetensors"
    )
    assert code == 0 and len(out) == 2 and all(line.strip() for line in out)
    code, _, err = _chat(monkeypatch, capsys, ["hi"], tmp_path / "c.safetensors", "--compress-every", "2")
    assert code == 2 and "--compress-every needs a cache of whole messages" in err.replace("\n", " ")


@pytest.mark.integration
def test_slash_commands_are_never_sent_to_the_model(smol, monkeypatch, capsys, tmp_path):
    saved = tmp_path / "chat.safetensors"
    lines = [
        "/help",
        "/frobnicate now",
        f"/save {tmp_path / 'missing' / 'x.safetensors'}",
        "Which library?",
        f"/save {saved}",
    ]
    code, out, err = _chat(monkeypatch, capsys, lines, FIXTURES / "mini-agent.json")
    text = "\n".join(out)
    assert code == 0 and "Traceback" not in err
    assert "/save FILE" in text and "unknown command /frobnicate" in text
    assert "not saved" in text and "does not exist" in text and not (tmp_path / "missing").exists()
    assert out[-1] == f"saved {saved}"
    session = Session.load(saved, smol)
    assert [m.content for m in session.messages if m.role == "user"][-1] == "Which library?"  # the only one sent
    assert sum(m.content.startswith("/") for m in session.messages) == 0


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--max-new-tokens", "-1"),
        ("--max-new-tokens", "0"),
        ("--temperature", "-1"),
        ("--temperature", "nan"),
        ("--compress-every", "-2"),
    ],
)
def test_chat_refuses_bad_numbers_before_loading_a_model(capsys, flag, value):
    assert main(["chat", str(FIXTURES / "mini-agent.json"), "--model", "no-such-model", flag, value]) == 2
    assert flag in capsys.readouterr().err


@pytest.mark.integration
def test_undo_and_retry_take_back_the_last_exchange(smol, monkeypatch, capsys, tmp_path):
    saved = tmp_path / "chat.safetensors"
    lines = ["Which library hashes passwords?", "/retry", "Which test runner is used?", "/undo", f"/save {saved}"]
    code, out, err = _chat(monkeypatch, capsys, lines, FIXTURES / "mini-agent.json")
    assert code == 0 and "Traceback" not in err
    assert "forgot the last exchange" in "\n".join(out) and out[-1] == f"saved {saved}"
    session = Session.load(saved, smol)
    added = session.messages[8:]  # after the transcript's 8 messages: the retried exchange, once
    assert [(m.role, m.content) for m in added][0] == ("user", "Which library hashes passwords?")
    assert [m.role for m in added] == ["user", "assistant"]


@pytest.mark.integration
def test_a_running_compression_takes_only_the_new_messages(smol, monkeypatch, capsys, tmp_path):
    saved = tmp_path / "chat.safetensors"
    lines = [
        "Which library hashes passwords?",
        "/compress",
        "Which test runner is used?",
        "/compress",
        f"/save {saved}",
    ]
    args = (FIXTURES / "mini-agent.json", "--compress-every", "2", "--method", "knorm", "--ratio", "2")
    code, out, err = _chat(monkeypatch, capsys, lines, *args)
    assert code == 0 and "Traceback" not in err and out[-1] == f"saved {saved}"
    assert out.count("no new messages to compress") == 2  # --compress-every took each exchange's two already
    assert err.count("compressing 2 new message(s) by knorm at 2×") >= 2 and "done 2/2" in err
    session = Session.load(saved, smol)
    compressed = [s.compressed for s in session.cache.segments]
    assert compressed == [False] * 8 + [True] * 4  # the transcript's messages stay as the chat opened them
    assert session.method.name == "knorm"


def test_a_recipe_flag_is_refused_for_a_method_without_one(capsys):
    transcript = str(FIXTURES / "mini-agent.json")
    assert main(["chat", transcript, "--model", "smollm2-135m", "--steps", "2"]) == 2
    assert "--steps is a setting of vkv's recipe, and method 'am' has none (--method vkv takes it)" in (
        capsys.readouterr().err.replace("\n", " ")
    )
