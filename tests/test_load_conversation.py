"""`vkv.load_conversation`: OpenAI, Anthropic, JSON-lines and vkv conversations, their format detected from the data,
read by `vkv import`'s readers with its errors; `vkv.compress` and `Session.extend` take any of them; a session
compresses by Attention Matching unless told otherwise."""

import inspect
import json
import pydoc
import re

import pytest
import torch

import vkv
from tests.conftest import FIXTURES
from vkv.errors import VkvError
from vkv.text.formats import import_conversation
from vkv.text.transcript import load_transcript

SAMPLES = FIXTURES / "import"
CASES = [("openai-tools.json", "openai"), ("anthropic-tools.json", "anthropic"), ("session-log.jsonl", "jsonl-log")]


def imported_messages(name: str, fmt: str):
    return load_transcript_messages(import_conversation(SAMPLES / name, fmt).transcript)


def load_transcript_messages(record: dict):
    from vkv.text.transcript import parse_transcript

    return parse_transcript(record).messages


@pytest.mark.parametrize(("name", "fmt"), CASES)
def test_a_file_in_each_format_reads_as_vkv_import_reads_it(name, fmt):
    transcript = vkv.load_conversation(SAMPLES / name)
    assert transcript.messages == imported_messages(name, fmt)
    assert transcript.path == str(SAMPLES / name) and transcript.questions == ()
    assert vkv.load_conversation(str(SAMPLES / name)).messages == transcript.messages  # a str path too


@pytest.mark.parametrize(("name", "fmt"), CASES[:2])
def test_data_in_each_format_reads_as_its_file_does(name, fmt):
    data = json.loads((SAMPLES / name).read_text())
    assert vkv.load_conversation(data).messages == imported_messages(name, fmt)
    if fmt == "openai":  # a bare list of messages, as the chat-completions API takes them
        assert vkv.load_conversation(data["messages"]).messages == imported_messages(name, fmt)


def test_vkv_transcripts_and_messages_pass_through():
    path = FIXTURES / "mini-agent.json"
    transcript = vkv.load_conversation(path)
    assert transcript == load_transcript(path)  # questions and hash kept
    assert vkv.load_conversation(transcript) is transcript
    assert vkv.load_conversation(list(transcript.messages)).messages == transcript.messages


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "field messages[0].content[0]",
        ),
        (
            [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}, {"name": "g"}]}],
            "marks of more than one format (vkv: messages[0].tool_calls[1].name; openai: messages[0].tool_calls[0]",
        ),
        (
            [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]},
                {"role": "tool", "tool_call_id": "c", "content": "y"},
            ],
            "marks of more than one format (openai: messages[1].tool_call_id; anthropic: messages[0].content[0]",
        ),
        ([{"role": "user", "content": 5}], "field messages[0].content: must be a string, got int (read as vkv's own"),
        ([{"content": "hi"}], "field messages[0].role: is missing (read as vkv's own format"),
        (5, "field messages: expected a file path, a list of message dicts or a Transcript, got int"),
    ],
)
def test_what_no_reader_takes_is_refused_naming_the_field_with_a_hint(data, message):
    with pytest.raises(VkvError, match=re.escape(message)):
        vkv.load_conversation(data)


def test_a_file_is_refused_naming_it(tmp_path):
    with pytest.raises(VkvError, match=re.escape(f"{tmp_path / 'none.json'}: no such conversation file")):
        vkv.load_conversation(tmp_path / "none.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"messages": [')
    with pytest.raises(VkvError, match=re.escape(f"{broken}: malformed JSON")):
        vkv.load_conversation(broken)


def test_vkv_compress_takes_an_openai_and_an_anthropic_export(tiny_llama):
    model, tokenizer = tiny_llama.model, tiny_llama.tokenizer
    for name, fmt in CASES[:2]:
        export = json.loads((SAMPLES / name).read_text())
        imported = vkv.load_conversation(SAMPLES / name)
        got = vkv.compress(model, tokenizer, export, method="knorm", ratio=4.0)
        want = vkv.compress(model, tokenizer, imported, method="knorm", ratio=4.0)
        assert got.get_seq_length() == want.get_seq_length() > 0, fmt
        for a, b in zip(got.layers, want.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values), fmt


def test_session_extend_takes_an_export_and_a_file(tiny_llama):
    export = json.loads((SAMPLES / "anthropic-tools.json").read_text())
    session = vkv.Session(tiny_llama)
    session.extend(export)
    assert tuple(session.messages) == imported_messages("anthropic-tools.json", "anthropic")
    other = vkv.Session(tiny_llama)
    other.extend(SAMPLES / "anthropic-tools.json")
    assert other.ids == session.ids
    with pytest.raises(VkvError, match="message 8: .*unknown role 'robot'"):  # vkv's own dicts: the session's index
        session.append({"role": "robot", "content": "hi"})


def test_help_shows_vkv_compress_signature_and_documentation():
    parameters = inspect.signature(vkv.compress).parameters
    assert list(parameters)[:5] == ["model", "tokenizer", "messages", "method", "ratio"]
    assert parameters["method"].default == "am"
    text = pydoc.render_doc(vkv.compress, renderer=pydoc.plaintext)
    assert "compress(model, tokenizer, messages" in text and "span tokens per entry" in text


def test_a_session_compresses_by_attention_matching_unless_told(tiny_llama, tmp_path):
    assert vkv.Session(tiny_llama).method.name == "am"
    by_name = vkv.Session(tiny_llama, "vkv").method  # vkv by name: targets from the running cache
    assert by_name.name == "vkv" and by_name.settings().target_source == "online"
    with pytest.raises(VkvError, match="field method: unknown method 'zip'"):
        vkv.Session(tiny_llama, method="zip")
    session = vkv.Session(tiny_llama, method="knorm")
    session.extend(SAMPLES / "openai-tools.json")
    by_default = session.compress((1, 3), 4.0)
    named = vkv.Session(tiny_llama)
    named.extend(SAMPLES / "openai-tools.json")
    by_name = named.compress((1, 3), 4.0, method=vkv.get_method("knorm"))
    assert [torch.equal(a.keys, b.keys) for a, b in zip(by_default, by_name)] == [True, True]
    session.save(tmp_path / "s.safetensors")
    assert vkv.Session.load(tmp_path / "s.safetensors", tiny_llama).method.name == "knorm"
