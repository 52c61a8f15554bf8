import copy
import json

import pytest

from tests.conftest import FIXTURES, bundled_transcripts
from vkv.errors import VkvError
from vkv.text.transcript import ChatFormat, load_transcript, parse_transcript, render

QWEN_STYLE = (FIXTURES / "qwen25_style_chatml.jinja").read_text()


@pytest.fixture(scope="module")
def qwen_style_tokenizer(smol_tokenizer):
    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = QWEN_STYLE
    return tok


def assert_tiles_and_prefixes(transcript, tokenizer):
    rendered = render(transcript, tokenizer)
    assert rendered.spans[0].start == 0 and rendered.spans[-1].end == len(rendered.ids)
    for a, b in zip(rendered.spans, rendered.spans[1:]):
        assert a.end == b.start and a.length > 0
    assert tokenizer(rendered.text, add_special_tokens=False)["input_ids"] == rendered.ids
    # rendering the first i messages alone gives exactly the first tokens of the full rendering
    for cut in sorted({1, len(transcript.messages) // 2, len(transcript.messages) - 1}):
        head = parse_transcript({"id": "head", "messages": [_as_json(m) for m in transcript.messages[:cut]]})
        assert render(head, tokenizer).ids == rendered.ids[: rendered.spans[cut - 1].end]
    return rendered


def _as_json(m):
    d = {"role": m.role, "content": m.content}
    if m.tool_calls:
        d["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    if m.name:
        d["name"] = m.name
    return d


@pytest.mark.parametrize("path", [FIXTURES / "mini-agent.json", *bundled_transcripts()], ids=lambda p: p.name)
@pytest.mark.parametrize("template", ["smollm2", "qwen25-style"])
def test_spans_tile_and_prefixes_are_token_prefixes(path, template, smol_tokenizer, qwen_style_tokenizer):
    tokenizer = smol_tokenizer if template == "smollm2" else qwen_style_tokenizer
    transcript = load_transcript(path)
    rendered = assert_tiles_and_prefixes(transcript, tokenizer)
    assert len(rendered.spans) == len(transcript.messages)


def test_tool_calls_are_detected_and_inlined_only_when_dropped(
    smol_tokenizer, qwen_style_tokenizer, mini_transcript_path
):
    transcript = load_transcript(mini_transcript_path)
    smol = render(transcript, smol_tokenizer)
    qwen = render(transcript, qwen_style_tokenizer)
    assert not ChatFormat(smol_tokenizer).keeps_tool_calls and smol.inlined_tool_calls
    assert ChatFormat(qwen_style_tokenizer).keeps_tool_calls and not qwen.inlined_tool_calls
    for rendered in (smol, qwen):
        assert '"command": "cat package.json"' in rendered.text
        assert rendered.text.count("<tool_call>") == 2


def test_grouped_tool_messages_are_refused_clearly(qwen_style_tokenizer):
    data = {
        "id": "t",
        "messages": [
            {"role": "user", "content": "run both"},
            {
                "role": "assistant",
                "content": "ok",
                "tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}],
            },
            {"role": "tool", "name": "a", "content": "out a"},
            {"role": "tool", "name": "b", "content": "out b"},
        ],
    }
    with pytest.raises(VkvError, match=r"messages\[3\].*token prefixes"):
        render(parse_transcript(data), qwen_style_tokenizer)


GOOD = {
    "id": "x",
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
    "questions": [{"id": "q", "question": "?", "accept": ["a"], "choices": ["a", "b"], "source_turns": [1]}],
}


def mutate(path, value):
    data = copy.deepcopy(GOOD)
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "path,value,message",
    [
        (("messages", 1, "role"), KeyError, r"messages\[1\]\.role: is missing"),
        (("messages", 1, "role"), "robot", r"messages\[1\]\.role: unknown role 'robot'"),
        (("messages", 1, "content"), "  ", r"messages\[1\]\.content: is empty"),
        (("messages", 1, "content"), 3, r"messages\[1\]\.content: must be a string"),
        (("messages",), [], r"messages: must be a non-empty list"),
        (("questions", 0, "accept"), [], r"questions\[0\]\.accept: must not be empty"),
        (("questions", 0, "question"), KeyError, r"questions\[0\]\.question: is missing"),
        (("questions", 0, "choices"), ["a"], r"questions\[0\]\.choices: needs at least two"),
        (("questions", 0, "source_turns"), [2], r"source_turns: turn 2 is out of range"),
        (("questions", 0, "source_turns"), ["1"], r"source_turns: must be a list of message indices"),
        (("questions", 0, "reject"), ["A"], r"reject: repeats accepted"),
        (("messages", 0, "tool_calls"), [{"name": "x"}], r"only assistant messages may call tools"),
    ],
)
def test_bad_transcripts_name_file_and_field(tmp_path, path, value, message):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(mutate(path, value)))
    with pytest.raises(VkvError, match=message) as err:
        load_transcript(f)
    assert str(f) in str(err.value)


def test_duplicate_question_ids_and_malformed_json(tmp_path):
    data = copy.deepcopy(GOOD)
    data["questions"].append(copy.deepcopy(data["questions"][0]))
    f = tmp_path / "dup.json"
    f.write_text(json.dumps(data))
    with pytest.raises(VkvError, match=r"questions\[1\]\.id: duplicate question id 'q'"):
        load_transcript(f)
    f.write_text('{"id": "x", "messages": [')
    with pytest.raises(VkvError, match=r"dup\.json: malformed JSON at line 1"):
        load_transcript(f)
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(VkvError, match="not UTF-8"):
        load_transcript(f)


def test_default_span_skips_leading_system_message(mini_transcript_path, smol_tokenizer):
    transcript = load_transcript(mini_transcript_path)
    assert transcript.default_span() == (1, len(transcript.messages))
    rendered = render(transcript, smol_tokenizer)
    start, end = rendered.token_span(1, 3)
    assert (start, end) == (rendered.spans[1].start, rendered.spans[2].end)
    with pytest.raises(VkvError, match="empty or outside"):
        rendered.token_span(3, 3)
