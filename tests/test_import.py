"""`vkv import`: OpenAI, Anthropic and JSON-lines conversations become transcripts whose tool calls and results the
chat template renders; an imported conversation compresses and answers from the CLI, eval refuses it (no questions),
and what vkv cannot hold is refused naming the field."""

import json
import re

import pytest

from tests.conftest import FIXTURES
from vkv.cli import main
from vkv.errors import VkvError
from vkv.text.formats import import_conversation
from vkv.text.transcript import load_transcript, render

SAMPLES = FIXTURES / "import"
CASES = [("openai-tools.json", "openai"), ("anthropic-tools.json", "anthropic"), ("session-log.jsonl", "jsonl-log")]


@pytest.mark.parametrize(("name", "fmt"), CASES)
def test_each_format_keeps_the_calls_and_names_each_result_after_its_call(name, fmt, smol_tokenizer, tmp_path):
    out = tmp_path / "t.json"
    assert main(["import", str(SAMPLES / name), "--format", fmt, "--out", str(out)]) == 0
    transcript = load_transcript(out)
    calls = [c.name for m in transcript.messages for c in m.tool_calls]
    results = [m.name for m in transcript.messages if m.role == "tool"]
    assert calls == ["read_file", "apply_patch"] and results == calls
    assert transcript.messages[-1].content == "Fixed: totals now use Decimal with ROUND_HALF_EVEN."
    assert transcript.questions == ()
    assert render(transcript, smol_tokenizer).ids  # the chat template renders it, message by message


def test_anthropic_blocks_keep_their_order_and_count_what_is_dropped():
    imported = import_conversation(SAMPLES / "anthropic-tools.json", "anthropic")
    roles = [m["role"] for m in imported.transcript["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant", "tool", "assistant"]
    assert imported.transcript["messages"][4]["content"] == "Use Decimal if floats are the cause."
    assert imported.skipped == {"thinking blocks": 1}
    assert "path" in imported.transcript["messages"][2]["tool_calls"][0]["arguments"]


def test_a_log_response_split_over_lines_is_one_message():
    imported = import_conversation(SAMPLES / "session-log.jsonl", "jsonl-log")
    first = imported.transcript["messages"][1]
    assert first["content"] == "Reading the totals module." and first["tool_calls"][0]["name"] == "read_file"
    assert imported.skipped == {"lines without a message (summary)": 1}


def test_an_imported_conversation_compresses_and_answers_and_eval_refuses_it(tmp_path, capsys):
    transcript, cache = tmp_path / "t.json", tmp_path / "c.safetensors"
    assert main(["import", str(SAMPLES / "openai-tools.json"), "--format", "openai", "--out", str(transcript)]) == 0
    model = ["--model", "smollm2-135m", "--device", "cpu"]
    assert main(["compress", str(transcript), *model, "--method", "kvzip", "--ratio", "4", "--out", str(cache)]) == 0
    question = "Which rounding mode do the totals use now?"
    assert main(["ask", str(cache), *model, "--question", question, "--max-new-tokens", "16"]) == 0
    assert "ROUND_HALF_EVEN" in capsys.readouterr().out
    assert main(["eval", str(transcript), *model, "--method", "full"]) == 2
    assert "field questions: nothing to evaluate" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fmt", "data", "field"),
    [
        (
            "openai",
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages[0].content[0]",
        ),
        (
            "openai",
            [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
            "messages[0].tool_calls[0].function.arguments",
        ),
        ("openai", [{"role": "critic", "content": "x"}], "messages[0].role"),
        (
            "anthropic",
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]},
            "messages[0].content[0]",
        ),
        (
            "anthropic",
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
        ),
    ],
)
def test_what_vkv_cannot_hold_is_refused_naming_the_field(tmp_path, fmt, data, field):
    path = tmp_path / "in.json"
    path.write_text(json.dumps(data))
    with pytest.raises(VkvError, match=re.escape(f"{path}: field {field}")):
        import_conversation(path, fmt)


def test_bad_files_are_one_sentence_and_the_input_is_never_the_output(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_text('{"role": "user", "content": "hi"}\n{"role": "assistant", "content": \n')
    assert main(["import", str(log), "--format", "jsonl-log", "--out", str(tmp_path / "t.json")]) == 2
    assert f"{log}:2: malformed JSON" in capsys.readouterr().err
    source = SAMPLES / "openai-tools.json"
    before = source.read_bytes()
    assert main(["import", str(source), "--format", "openai", "--out", str(source)]) == 2
    assert source.read_bytes() == before
    empty = tmp_path / "empty.json"
    empty.write_text('{"messages": []}')
    assert main(["import", str(empty), "--format", "anthropic", "--out", str(tmp_path / "t.json")]) == 2
    assert not (tmp_path / "t.json").exists()


DEEP = "[" * 150 + "]" * 150


@pytest.mark.parametrize(
    ("fmt", "text", "field", "problem"),
    [
        ("openai", '[{"role": "assistant", "content": "x", "tool_calls": 5}]', "messages[0].tool_calls", "a list"),
        (
            "anthropic",
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}',
            "messages[0].content[0].text",
            "a string",
        ),
        ("openai", '[{"role": "user", "content": "a\\ud800b"}]', "[0].content", "lone surrogate"),
        ("jsonl-log", '{"role": "user", "content": "a\\udfffb"}\n', "content", "lone surrogate"),
        (
            "openai",
            '[{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"x": NaN}}}]}]',
            "[0].tool_calls[0].function.arguments.x",
            "not a JSON number",
        ),
        (
            "openai",
            json.dumps(
                [
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"function": {"name": "f", "arguments": '{"a": ' + DEEP + "}"}}],
                    }
                ]
            ),
            "messages[0].tool_calls[0].function.arguments",
            "more than 100 levels deep",
        ),
        ("openai", json.dumps([{"role": "user", "content": json.loads(DEEP)}]), "", "more than 100 levels deep"),
    ],
)
def test_import_accepts_only_what_every_vkv_reader_accepts(tmp_path, fmt, text, field, problem):
    path = tmp_path / "in.json"
    path.write_text(text)
    with pytest.raises(VkvError, match=re.escape(field) + ".*" + problem):
        import_conversation(path, fmt)


def test_json_lines_split_only_at_newlines(tmp_path):
    path = tmp_path / "log.jsonl"
    line = {"role": "user", "content": "first\u2028second\x85third\x1cfourth"}
    path.write_text(json.dumps(line, ensure_ascii=False) + "\r\n" + json.dumps({"role": "assistant", "content": "ok"}))
    messages = import_conversation(path, "jsonl-log").transcript["messages"]
    assert [m["content"] for m in messages] == [line["content"], "ok"]


def test_the_other_format_is_named_when_a_file_is_read_as_the_wrong_one(tmp_path):
    anthropic = SAMPLES / "anthropic-tools.json"
    with pytest.raises(VkvError, match="try --format anthropic"):
        import_conversation(anthropic, "openai")
    with pytest.raises(VkvError, match="try --format openai"):
        import_conversation(SAMPLES / "openai-tools.json", "anthropic")
