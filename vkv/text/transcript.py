"""Coding-agent transcripts: the JSON format, its validation, and rendering into token ids with per-message spans.

A rendering is only useful to vkv if message boundaries are token boundaries: the ids of the first i
messages must be a prefix of the ids of the first i+1. `render` checks this for every message and
refuses a chat template that breaks it, so a span [a, b) of messages is always a span of token ids.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vkv.errors import TOO_LONG_REMEDY, VkvError
from vkv.io import check_plain, check_printable, parse_json, read_input
from vkv.text.plain import control_strings, encode, longest_token_chars, plain_ranges

ROLES = ("system", "user", "assistant", "tool")
SPLITS = ("dev", "test")  # transcripts/dev/ chooses levers, transcripts/test/ reports them
# What a question asks about: a choice the conversation made, a value a tool output showed, or the final value of
# something a later turn changed (its `reject` holds the stale value). Optional; reports break retention down by it.
QUESTION_KINDS = ("decision", "tool_output", "change")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    name: str | None = None


@dataclass(frozen=True)
class Question:
    id: str
    question: str
    accept: tuple[str, ...]
    reject: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    answer_prefix: str = ""
    source_turns: tuple[int, ...] = ()
    kind: str = ""  # one of QUESTION_KINDS, or "" when not labelled


@dataclass(frozen=True)
class Transcript:
    id: str
    messages: tuple[Message, ...]
    questions: tuple[Question, ...]
    description: str = ""
    path: str = ""
    sha256: str = ""
    window: tuple[int, int] | None = None  # for a window of the file's transcript: its messages [first, last)

    @property
    def split(self) -> str:
        """`dev` or `test` for a file in a folder of that name (transcripts/dev/, transcripts/test/), else ""."""
        folder = Path(self.path).parent.name if self.path else ""
        return folder if folder in SPLITS else ""

    def default_span(self) -> tuple[int, int]:
        """Turns compressed by default: every message after the leading system message."""
        first = 1 if self.messages and self.messages[0].role == "system" else 0
        return first, len(self.messages)


# ---- loading and validation -------------------------------------------------------------------


def load_transcript(path: str | Path) -> Transcript:
    """Read and validate a transcript file; every violation is a VkvError naming the file and field."""
    p = Path(path)
    raw_bytes = read_input(p, "transcript file")  # bounded: /dev/zero or a FIFO is refused, not read forever
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VkvError(f"{p}: not UTF-8 text (byte {exc.start})") from exc
    data = parse_json(text, str(p), "transcript file")
    return parse_transcript(data, source=str(p), sha256=hashlib.sha256(raw_bytes).hexdigest())


def parse_transcript(data: Any, source: str = "<transcript>", sha256: str = "") -> Transcript:
    where = _Where(source)
    if not isinstance(data, dict):
        where.fail("", "top level must be a JSON object")
    check_plain(data, source, "transcript")  # text a tokenizer can encode, numbers JSON can write
    tid = _string(data, "id", where, "", printed=True)
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        where.fail("messages", "must be a non-empty list")
    parsed_messages = tuple(_message(m, where, f"messages[{i}]") for i, m in enumerate(messages))
    questions = data.get("questions", [])
    if not isinstance(questions, list):
        where.fail("questions", "must be a list")
    parsed_questions = tuple(
        _question(q, where, f"questions[{i}]", len(parsed_messages)) for i, q in enumerate(questions)
    )
    seen: set[str] = set()
    for i, q in enumerate(parsed_questions):
        if q.id in seen:
            where.fail(f"questions[{i}].id", f"duplicate question id '{q.id}'")
        seen.add(q.id)
    description = data.get("description", "")
    if not isinstance(description, str):
        where.fail("description", "must be a string")
    return Transcript(tid, parsed_messages, parsed_questions, description, source, sha256)


class _Where:
    def __init__(self, source: str):
        self.source = source

    def fail(self, field_path: str, problem: str):
        at = f" field {field_path}" if field_path else ""
        raise VkvError(f"{self.source}:{at}: {problem}")


def _string(
    obj: dict,
    key: str,
    where: _Where,
    prefix: str,
    required: bool = True,
    empty_ok: bool = False,
    printed: bool = False,
) -> str:
    """The string at obj[key]; `printed` for an id or name that tables and messages show (printable text only)."""
    path = f"{prefix}.{key}" if prefix else key
    if key not in obj:
        if required:
            where.fail(path, "is missing")
        return ""
    value = obj[key]
    if not isinstance(value, str):
        where.fail(path, f"must be a string, got {type(value).__name__}")
    if not empty_ok and not value.strip():
        where.fail(path, "is empty")
    if printed:
        check_printable(value, where.source, path)
    return value


def _string_list(obj: dict, key: str, where: _Where, prefix: str, required: bool = False) -> tuple[str, ...]:
    path = f"{prefix}.{key}"
    if key not in obj:
        if required:
            where.fail(path, "is missing")
        return ()
    value = obj[key]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        where.fail(path, "must be a list of non-empty strings")
    if required and not value:
        where.fail(path, "must not be empty")
    return tuple(value)


def _message(m: Any, where: _Where, prefix: str) -> Message:
    if not isinstance(m, dict):
        where.fail(prefix, "must be an object")
    if "role" not in m:
        where.fail(f"{prefix}.role", "is missing")
    role = m["role"]
    if role not in ROLES:
        where.fail(f"{prefix}.role", f"unknown role {role!r} (expected one of {', '.join(ROLES)})")
    calls = m.get("tool_calls", [])
    content = _string(m, "content", where, prefix, empty_ok=bool(calls))  # a message may be its tool calls alone
    if not isinstance(calls, list):
        where.fail(f"{prefix}.tool_calls", "must be a list")
    tool_calls = tuple(_tool_call(c, where, f"{prefix}.tool_calls[{j}]") for j, c in enumerate(calls))
    if tool_calls and role != "assistant":
        where.fail(f"{prefix}.tool_calls", f"only assistant messages may call tools, this one is {role}")
    name = m.get("name")
    if name is not None and not isinstance(name, str):
        where.fail(f"{prefix}.name", "must be a string")
    if name is not None:
        check_printable(name, where.source, f"{prefix}.name")
    return Message(role, content, tool_calls, name)


def _tool_call(c: Any, where: _Where, prefix: str) -> ToolCall:
    if not isinstance(c, dict):
        where.fail(prefix, "must be an object")
    name = _string(c, "name", where, prefix, printed=True)
    args = c.get("arguments", {})
    if not isinstance(args, dict):
        where.fail(f"{prefix}.arguments", "must be an object")
    return ToolCall(name, args)


def _question(q: Any, where: _Where, prefix: str, n_messages: int) -> Question:
    if not isinstance(q, dict):
        where.fail(prefix, "must be an object")
    qid = _string(q, "id", where, prefix, printed=True)
    text = _string(q, "question", where, prefix)
    accept = _string_list(q, "accept", where, prefix, required=True)
    reject = _string_list(q, "reject", where, prefix)
    choices = _string_list(q, "choices", where, prefix)
    if "choices" in q and len(choices) < 2:  # an empty list too: omit the field instead
        where.fail(f"{prefix}.choices", "needs at least two choices (the correct one first)")
    if len(set(c.lower() for c in choices)) != len(choices):
        where.fail(f"{prefix}.choices", "contains duplicates")
    overlap = {a.lower() for a in accept} & {r.lower() for r in reject}
    if overlap:
        where.fail(f"{prefix}.reject", f"repeats accepted keyword(s) {sorted(overlap)}")
    answer_prefix = _string(q, "answer_prefix", where, prefix, required=False, empty_ok=True)
    turns = q.get("source_turns", [])
    if not isinstance(turns, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in turns):
        where.fail(f"{prefix}.source_turns", "must be a list of message indices")
    for t in turns:
        if not 0 <= t < n_messages:
            where.fail(f"{prefix}.source_turns", f"turn {t} is out of range (0..{n_messages - 1})")
    kind = _string(q, "kind", where, prefix, required=False)
    if kind and kind not in QUESTION_KINDS:
        where.fail(f"{prefix}.kind", f"unknown kind {kind!r} (expected one of {', '.join(QUESTION_KINDS)})")
    return Question(qid, text, accept, reject, choices, answer_prefix, tuple(turns), kind)


# ---- rendering --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MessageSpan:
    turn: int
    role: str
    start: int  # first token id index of this message in the rendering
    end: int  # one past the last

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass
class Rendered:
    """Token ids of a rendered conversation and the [start, end) token span of each message."""

    ids: list[int]
    spans: list[MessageSpan]
    text: str
    inlined_tool_calls: bool = False
    tool_role_as: str = "tool"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def message_starts(self) -> list[int]:
        """Each message's first token."""
        return [s.start for s in self.spans]

    @property
    def message_roles(self) -> list[str]:
        """Each message's role, parallel to `message_starts`."""
        return [s.role for s in self.spans]

    def evidence_distance(self, source_turns, turns: tuple[int, int]) -> tuple[int | None, int | None]:
        """Tokens and messages between the latest of a question's `source_turns` inside messages [first, last) (its
        nearest evidence there) and the end of that range; None when no source turn is inside."""
        first, last = turns
        inside = [t for t in source_turns if first <= t < last]
        if not inside:
            return None, None
        latest = max(inside)
        return self.spans[last - 1].end - self.spans[latest].end, last - 1 - latest

    def token_span(self, first_turn: int, last_turn_exclusive: int) -> tuple[int, int]:
        """Token range covering messages [first_turn, last_turn_exclusive)."""
        if not 0 <= first_turn < last_turn_exclusive <= len(self.spans):
            raise VkvError(
                f"turn span {first_turn}-{last_turn_exclusive - 1} is empty or outside 0..{len(self.spans) - 1}"
            )
        return self.spans[first_turn].start, self.spans[last_turn_exclusive - 1].end


class ChatFormat:
    """How one tokenizer's chat template treats tool calls and tool messages, detected by probing it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.keeps_tool_calls = self._probe_tool_calls()
        self.tool_role = "tool" if self._probe_tool_role() else "user"

    def to_chat(self, message: Message) -> dict[str, Any]:
        content = message.content
        if message.role == "tool" and self.tool_role != "tool":
            content = f"[output of tool {message.name or 'call'}]\n{content}"
        chat: dict[str, Any] = {"role": self.tool_role if message.role == "tool" else message.role, "content": content}
        if message.tool_calls:
            if self.keeps_tool_calls:
                chat["tool_calls"] = [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in message.tool_calls
                ]
            else:
                chat["content"] = content + "".join(inline_tool_call(c) for c in message.tool_calls)
        if message.role == "tool" and message.name and self.tool_role == "tool":
            chat["name"] = message.name
        return chat

    def render_text(self, chats: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(chats, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _probe_tool_calls(self) -> bool:
        marker = "vkvprobe_tool_7d1f"
        chats = [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "ok",
                "tool_calls": [{"type": "function", "function": {"name": marker, "arguments": {"x": 1}}}],
            },
        ]
        try:
            return marker in self.render_text(chats)
        except Exception:
            return False

    def _probe_tool_role(self) -> bool:
        marker = "vkvprobe_output_3c2a"
        chats = [{"role": "user", "content": "hi"}, {"role": "tool", "content": marker, "name": "bash"}]
        try:
            return marker in self.render_text(chats)
        except Exception:
            return False


def inline_tool_call(call: ToolCall) -> str:
    """Deterministic text form of a tool call for templates that drop `tool_calls`."""
    payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False, sort_keys=True)
    return f"\n<tool_call>\n{payload}\n</tool_call>"


def render(
    transcript: Transcript,
    tokenizer,
    chat_format: ChatFormat | None = None,
    max_tokens: int | None = None,
    remedy: str | None = None,
) -> Rendered:
    """Render every message with the chat template; spans tile the ids and prefixes are token prefixes.

    Linear in the transcript's length: the whole conversation is rendered and tokenised once, each message's text is
    found by rendering it after (at most) the first and the previous message, and each message's text is tokenised on
    its own. Their concatenations must equal the whole rendering and the whole tokenisation, which makes message
    boundaries token boundaries; anything else (a template that looks ahead, rewrites earlier messages or refuses the
    shortened context, a tokenizer merging across a boundary) takes the exact message-by-message path, which renders
    and tokenises every prefix (quadratic) and refuses in the same words as before. With `max_tokens` (the model's
    positions), a rendering longer than that is refused after one tokenisation, before any per-message work, and one
    whose characters could not fit even at the longest token is refused before tokenising; `remedy` ends that refusal
    with what the caller offers (default: the running command's, `TOO_LONG_REMEDY`).

    Message text is text: control-token strings (e.g. `<|im_end|>`) inside a message's content, name or tool calls
    become ordinary tokens, so the ids hold only the control tokens the chat template itself wrote (see `encode`)."""
    fmt = chat_format or ChatFormat(tokenizer)
    chats = [fmt.to_chat(m) for m in transcript.messages]
    where = transcript.path or transcript.id
    remedy = remedy or TOO_LONG_REMEDY.get()
    try:
        text = fmt.render_text(chats)
    except Exception:  # the exact path names the first message the template refuses
        return _render_by_prefixes(transcript, tokenizer, fmt, chats)
    if max_tokens:  # refused from its length alone: tokenising megabytes takes minutes and gigabytes
        most = max_tokens * longest_token_chars(tokenizer)
        if len(text) > most:
            raise VkvError(
                f"{where}: renders to {len(text)} characters, more than the model's {max_tokens} positions can hold "
                f"(at most {longest_token_chars(tokenizer)} characters a token); {remedy}"
            )
    plain = plain_ranges(fmt, chats, text, where)
    ids = encode(tokenizer, text, plain, where)
    if max_tokens and len(ids) > max_tokens:  # the upper bound the spans would tile: no message work is needed
        raise VkvError(f"{where}: renders to {len(ids)} tokens, beyond the model's {max_tokens} positions; {remedy}")
    pieces = _message_texts(fmt, chats)
    if pieces is None or "".join(pieces) != text:
        return _render_by_prefixes(transcript, tokenizer, fmt, chats)
    if plain:  # each piece keeps the plain ranges that fall inside it
        piece_ids, offset = [], 0
        for piece in pieces:
            inside = [(a - offset, b - offset) for a, b in plain if offset <= a and b <= offset + len(piece)]
            piece_ids.append(encode(tokenizer, piece, inside, where))
            offset += len(piece)
    else:
        piece_ids = tokenizer(pieces, add_special_tokens=False)["input_ids"]  # one batched call
    spans: list[MessageSpan] = []
    position = 0
    for i, (message, own) in enumerate(zip(transcript.messages, piece_ids)):
        if not own or ids[position : position + len(own)] != own:
            return _render_by_prefixes(transcript, tokenizer, fmt, chats)
        spans.append(MessageSpan(i, message.role, position, position + len(own)))
        position += len(own)
    if position != len(ids):
        return _render_by_prefixes(transcript, tokenizer, fmt, chats)
    return Rendered(ids, spans, text, inlined_tool_calls=not fmt.keeps_tool_calls, tool_role_as=fmt.tool_role)


def _message_texts(fmt: ChatFormat, chats: list[dict[str, Any]]) -> list[str] | None:
    """Each message's text as the template renders it after the first message and the one before it (what a
    template's system-prompt and role-alternation rules look at), or None when one does not extend its context."""
    pieces = []
    for i in range(len(chats)):
        context = [chats[0], chats[i - 1]] if i >= 2 else chats[:i]
        try:
            before = fmt.render_text(context) if context else ""
            after = fmt.render_text([*context, chats[i]])
        except Exception:  # a shortened context the template refuses (e.g. by alternation): the exact path decides
            return None
        if not after.startswith(before):
            return None
        pieces.append(after[len(before) :])
    return pieces


def _render_by_prefixes(transcript: Transcript, tokenizer, fmt: ChatFormat, chats: list[dict[str, Any]]) -> Rendered:
    """The exact check: render and tokenise the first i messages for every i (quadratic; `render`'s fallback)."""
    spans: list[MessageSpan] = []
    ids: list[int] = []
    text = ""
    for i, message in enumerate(transcript.messages):
        try:
            text = fmt.render_text(chats[: i + 1])
        except Exception as exc:  # jinja raises template-specific errors (e.g. role alternation)
            raise VkvError(
                f"{transcript.path or transcript.id}: messages[{i}]: the chat template refused it ({exc})"
            ) from exc
        where = transcript.path or transcript.id
        prefix_ids = encode(tokenizer, text, plain_ranges(fmt, chats[: i + 1], text, where), where)
        if prefix_ids[: len(ids)] != ids:
            raise VkvError(
                f"{transcript.path or transcript.id}: messages[{i}]: the chat template does not render message "
                "prefixes as token prefixes, so message spans are not well defined for this model"
            )
        if len(prefix_ids) == len(ids):
            raise VkvError(f"{transcript.path or transcript.id}: messages[{i}]: renders to no tokens")
        spans.append(MessageSpan(i, message.role, len(ids), len(prefix_ids)))
        ids = prefix_ids
    return Rendered(ids, spans, text, inlined_tool_calls=not fmt.keeps_tool_calls, tool_role_as=fmt.tool_role)


def followup(
    tokenizer,
    rendered: Rendered,
    transcript: Transcript,
    user_text: str,
    answer_prefix: str = "",
    chat_format: ChatFormat | None = None,
) -> tuple[list[int], str]:
    """Ids (and the whole text) that continue `rendered` with a user message, the assistant prompt and an
    answer prefix; checked to be a token-level continuation: rendered.ids + ids == ids of the whole text.
    """
    fmt = chat_format or ChatFormat(tokenizer)
    chats = [fmt.to_chat(m) for m in transcript.messages] + [{"role": "user", "content": user_text}]
    where = transcript.path or transcript.id
    text = fmt.render_text(chats, add_generation_prompt=True)
    plain = plain_ranges(fmt, chats, text, where, add_generation_prompt=True)
    if answer_prefix:
        if any(c in answer_prefix for c in control_strings(tokenizer)):
            plain.append((len(text), len(text) + len(answer_prefix)))
        text += answer_prefix
    if not text.startswith(rendered.text):
        raise VkvError(
            f"{where}: the chat template rewrites earlier messages when a "
            "question is appended, so the question cannot continue the cached context"
        )
    full = encode(tokenizer, text, plain, where)
    if full[: len(rendered.ids)] != rendered.ids:
        raise VkvError(f"{transcript.path or transcript.id}: appending a question changes the tokens of the context")
    return full[len(rendered.ids) :], text


def assistant_prompt_length(
    tokenizer, rendered: Rendered, transcript: Transcript, turn: int, chat_format: ChatFormat | None = None
) -> int:
    """Tokens at the start of message `turn` that the chat template writes to prompt the assistant
    (`add_generation_prompt` after the messages before it): given to a model when it answers, not predicted by it.
    0 when that prompt does not tokenise as the message's own opening, so every token of the message counts."""
    fmt = chat_format or ChatFormat(tokenizer)
    chats = [fmt.to_chat(m) for m in transcript.messages[:turn]]
    where = transcript.path or transcript.id
    text = fmt.render_text(chats, add_generation_prompt=True)
    ids = encode(tokenizer, text, plain_ranges(fmt, chats, text, where, add_generation_prompt=True), where)
    span = rendered.spans[turn]
    head = ids[span.start :]
    if ids[: span.start] != rendered.ids[: span.start] or rendered.ids[span.start : span.start + len(head)] != head:
        return 0
    return len(head) if len(head) < span.length else 0


def continuation_ids(tokenizer, prompt_text: str, continuation: str) -> list[int]:
    """Ids of `continuation` as it tokenises after `prompt_text` (leading space included); control-token text in
    the continuation stays text."""
    plain = [(len(prompt_text), len(prompt_text) + len(continuation))]
    head = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    both = encode(tokenizer, prompt_text + continuation, plain, "an answer choice")
    if both[: len(head)] == head and len(both) > len(head):
        return both[len(head) :]
    return encode(tokenizer, continuation, [(0, len(continuation))], "an answer choice")


def parse_turn_span(text: str | None, transcript: Transcript) -> tuple[int, int]:
    """'turns:A-B' (inclusive, 0-based) → [A, B+1); None → the default span."""
    if text is None:
        return transcript.default_span()
    body = text.removeprefix("turns:")
    try:
        first, last = (int(x) for x in body.split("-", 1)) if "-" in body else (int(body), int(body))
    except ValueError:
        raise VkvError(f"--span {text!r}: expected turns:A-B with message indices, e.g. turns:1-12") from None
    n = len(transcript.messages)
    if not 0 <= first <= last < n:
        raise VkvError(f"--span {text!r}: turns must satisfy 0 ≤ A ≤ B < {n} for {transcript.path or transcript.id}")
    return first, last + 1
