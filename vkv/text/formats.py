"""Conversations in the formats agent builders keep them, read into vkv transcripts.

- `openai`: chat-completions messages, a JSON list or a request body's `messages` (system/developer, user,
  assistant with `tool_calls` whose `arguments` is a JSON string, `tool` with `tool_call_id`); content a string or
  a list of text parts.
- `anthropic`: a Messages request body (`system`, `messages`), content a string or blocks: `text`, `tool_use`
  (an assistant's call), `tool_result` (in a user turn: becomes a `tool` message naming the call's tool).
- `jsonl-log`: an agent session log, one JSON object per line: a message in either shape above, or an envelope
  holding one under `message` (as coding-agent session logs write them); lines that hold no message (summaries,
  events) are skipped and counted.

Tool calls and results become a transcript's `tool_calls` and `tool` messages, so the model's chat template renders
them as it renders its own. Reasoning blocks (`thinking`, `redacted_thinking`) are dropped and counted: chat templates
do not render them for past turns. Anything else (images, documents, unknown block types) is refused with the field
it sits in: vkv compresses text, and a conversation is never silently shortened. Questions are not part of any of
these formats; an imported transcript compresses, chats and answers, and `vkv eval` refuses it until questions are
added.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vkv.errors import VkvError
from vkv.io import check_depth, check_plain, parse_json, read_input
from vkv.text.transcript import Message, Transcript, parse_transcript

FORMATS = ("openai", "anthropic", "jsonl-log")
DROPPED_BLOCKS = ("thinking", "redacted_thinking")
BLOCKS_OF_ANTHROPIC = ("tool_use", "tool_result", *DROPPED_BLOCKS)  # a log line holding one is read as Anthropic's


@dataclass
class Imported:
    """A transcript as a JSON-ready dict, and what the reader left out (by kind, counted)."""

    transcript: dict[str, Any]
    skipped: Counter = field(default_factory=Counter)
    source: str = ""  # the file (or "messages"), as errors name it


def import_conversation(path: str | Path, fmt: str, transcript_id: str | None = None) -> Imported:
    """Read `path` in format `fmt` into a validated transcript (id: `transcript_id`, default the file's stem)."""
    if fmt not in FORMATS:
        raise VkvError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    p = Path(path)
    text = _utf8(p.read_bytes(), p)
    if fmt == "jsonl-log":
        reader = _log_lines(text, str(p))
    else:
        reader = _read(_json(text, str(p)), fmt, str(p), "--format ")
    return _imported(reader, str(p), fmt, transcript_id or p.stem, f"imported from {p.name} ({fmt})")


def load_conversation(conversation: Any) -> Transcript:
    """A conversation as vkv's Transcript, its format detected from the data: a path (str or Path) to a JSON or
    JSON-lines file, a list of message dicts, a request body ({'messages': [...]}, Anthropic's with 'system'), a list
    of Messages or a Transcript (returned as it is). The formats are `vkv import`'s (OpenAI chat completions, Anthropic
    Messages, an agent's JSON-lines log) and vkv's own (a transcript file, or role/content messages whose tool calls
    are {'name', 'arguments'}); each is read by the same reader, with the same errors naming the field, as `vkv import`
    and `vkv.load_transcript` give. Data with the marks of two formats, or that fits none, is refused with a hint."""
    if isinstance(conversation, Transcript):
        return conversation
    if isinstance(conversation, (str, Path)):
        return _load_file(Path(conversation))
    if isinstance(conversation, (list, tuple)) and conversation and all(isinstance(m, Message) for m in conversation):
        return Transcript("messages", tuple(conversation), ())
    if isinstance(conversation, tuple):
        conversation = list(conversation)
    if not isinstance(conversation, (list, dict)):
        raise VkvError(
            f"field messages: expected a file path, a list of message dicts or a Transcript, got "
            f"{type(conversation).__name__}"
        )
    return _from_data(conversation, "messages", "messages")


def _load_file(p: Path) -> Transcript:
    raw = read_input(p, "conversation file")  # a device, FIFO, directory or oversized file: refused unread
    text, log = _utf8(raw, p), False
    try:
        data = _json(text, str(p))
        log = isinstance(data, dict) and "messages" not in data and ("role" in data or "message" in data)
    except VkvError:
        first = next((line for line in text.split("\n") if line.strip()), "")
        if first.strip() == text.strip() or not _is_object(first):
            raise  # not a JSON-lines log either: the whole file's error is the one to read
        log = True
    if log:  # one message, or an envelope holding one, per line
        return _transcript(_imported(_log_lines(text, str(p)), str(p), "jsonl-log", p.stem, f"read from {p.name}"))
    return _from_data(data, str(p), p.stem, hashlib.sha256(raw).hexdigest())


def _from_data(data: Any, source: str, transcript_id: str, sha256: str = "") -> Transcript:
    """`data` read as the one format it has marks of (vkv's own where it has none)."""
    fmt = detect_format(data, source)
    if fmt == "vkv":
        record = data if isinstance(data, dict) else {"id": transcript_id, "messages": data}
        try:
            return parse_transcript(record, source=source, sha256=sha256)
        except VkvError as exc:
            if _marks(data)["vkv"]:  # a transcript of vkv's own: its error is the whole story
                raise
            raise VkvError(f"{exc} ({NO_MARKS})") from None
    return _transcript(_imported(_read(data, fmt, source, ""), source, fmt, transcript_id, f"read as {fmt}"))


NO_MARKS = (
    "read as vkv's own format, as it has no mark of OpenAI's (tool_calls with a 'function', a tool_call_id) or "
    "Anthropic's (tool_use or tool_result blocks, a top-level 'system'); `vkv import --format` reads either"
)


def detect_format(data: Any, source: str = "messages") -> str:
    """The format `data` has marks of: `openai`, `anthropic` or `vkv` (also where it has none, as plain role/content
    messages are vkv's). Marks of two formats are refused, naming one mark of each."""
    marks = _marks(data)
    found = [fmt for fmt in ("vkv", "openai", "anthropic") if marks[fmt]]
    if len(found) > 1:
        seen = "; ".join(f"{fmt}: {marks[fmt][0]}" for fmt in found)
        raise VkvError(
            f"{source}: the conversation has marks of more than one format ({seen}); give all its messages one "
            "format (`vkv import --format openai|anthropic` reads either)"
        )
    return found[0] if found else "vkv"


def _marks(data: Any) -> dict[str, list[str]]:
    """Per format, the fields of `data` that only that format has (a field path and what is there)."""
    marks: dict[str, list[str]] = {"vkv": [], "openai": [], "anthropic": []}
    messages = data.get("messages") if isinstance(data, dict) else data
    if isinstance(data, dict):
        if "system" in data:
            marks["anthropic"].append("field system")
        if "questions" in data or "id" in data:
            marks["vkv"].append("a transcript's " + ("questions" if "questions" in data else "id"))
    if not isinstance(messages, list):
        return marks
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue
        at = f"messages[{i}]"
        if m.get("role") in ("developer", "function") or "tool_call_id" in m:
            marks["openai"].append(f"{at}." + ("tool_call_id" if "tool_call_id" in m else f"role {m['role']}"))
        calls = m.get("tool_calls")
        for j, call in enumerate(calls if isinstance(calls, list) else []):
            if isinstance(call, dict) and "function" in call:
                marks["openai"].append(f"{at}.tool_calls[{j}].function")
            elif isinstance(call, dict) and "name" in call:
                marks["vkv"].append(f"{at}.tool_calls[{j}].name")
        content = m.get("content")
        for j, block in enumerate(content if isinstance(content, list) else []):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind in {*BLOCKS_OF_ANTHROPIC, "image", "document"}:
                marks["anthropic"].append(f"{at}.content[{j}] ({kind})")
            elif kind in ("image_url", "input_audio", "refusal"):
                marks["openai"].append(f"{at}.content[{j}] ({kind})")
            elif kind == "text" and not marks["anthropic"]:  # text parts: both APIs' shape, read alike by either
                marks["openai"].append(f"{at}.content[{j}] (a list of parts)")
    if marks["anthropic"] and all(m.endswith("(a list of parts)") for m in marks["openai"]):
        marks["openai"] = []  # text blocks beside Anthropic's own are Anthropic's
    return marks


def _is_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _utf8(raw: bytes, p: Path) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VkvError(f"{p}: not UTF-8 text (byte {exc.start})") from None


def _log_lines(text: str, source: str) -> _Reader:
    reader = _Reader(source)
    # lines end at "\n" alone: str.splitlines would also cut at U+2028 and other separators JSON strings may hold
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            reader.log_line(_json(line, f"{source}:{number}"), f"line {number}")
    return reader


def _read(data: Any, fmt: str, source: str, flag: str) -> _Reader:
    """`data` read as `fmt` (openai or anthropic); refused data that looks like the other format says so, suggesting
    `flag` + its name (the command line's --format, or nothing where the format was detected)."""
    reader = _Reader(source)
    try:
        reader.openai(data) if fmt == "openai" else reader.anthropic(data)
    except VkvError as exc:
        other = _other_format(data, fmt)
        if other is None:
            raise
        raise VkvError(f"{exc}; the file looks like {other} format: try {flag or 'format '}{other}") from None
    return reader


def _imported(reader: _Reader, source: str, fmt: str, transcript_id: str, description: str) -> Imported:
    if not reader.messages:
        raise VkvError(f"{source}: no messages found in it as {fmt}")
    transcript = {"id": transcript_id, "description": description, "messages": reader.messages}
    # what vkv would refuse is refused now, naming the source: the written transcript must load as one
    check_depth(transcript, source, "imported transcript")
    parse_transcript(transcript, source=source)
    return Imported(transcript, reader.skipped, source)


def _transcript(imported: Imported) -> Transcript:
    return parse_transcript(imported.transcript, source=imported.source)


def _json(text: str, where: str) -> Any:
    """JSON as every vkv reader takes it: bounded nesting, finite numbers, Unicode text."""
    data = parse_json(text, where, "conversation")
    check_plain(data, where, "conversation")
    return data


def _other_format(data: Any, fmt: str) -> str | None:
    """The other format (`openai` or `anthropic`) when `data`, refused as `fmt`, has marks only that one has."""
    marks, other = _marks(data), "anthropic" if fmt == "openai" else "openai"
    return other if marks[other] and not marks[fmt] else None


class _Reader:
    """Messages appended in order; tool results named after the call they answer."""

    def __init__(self, source: str):
        self.source = source
        self.messages: list[dict[str, Any]] = []
        self.tool_names: dict[str, str] = {}  # call id → tool name
        self.skipped: Counter = Counter()
        self.last_id: str | None = None  # the previous log line's message id

    def fail(self, where: str, problem: str):
        raise VkvError(f"{self.source}: field {where}: {problem}")

    # ---- OpenAI chat completions ----------------------------------------------------------------
    def openai(self, data: Any) -> None:
        messages = data.get("messages") if isinstance(data, dict) else data
        if not isinstance(messages, list):
            self.fail("messages", "expected a list of messages, or an object with a 'messages' list")
        for i, m in enumerate(messages):
            self.openai_message(m, f"messages[{i}]")

    def openai_message(self, m: Any, where: str) -> None:
        if not isinstance(m, dict):
            self.fail(where, "must be an object")
        role = m.get("role")
        text = self.openai_content(m.get("content"), f"{where}.content")
        if role in ("system", "developer", "user"):
            self.add("system" if role == "developer" else role, text)
        elif role == "assistant":
            calls, listed = [], m.get("tool_calls") or []
            if not isinstance(listed, list):
                self.fail(f"{where}.tool_calls", f"must be a list of tool calls, got {type(listed).__name__}")
            for j, call in enumerate(listed):
                calls.append(self.openai_call(call, f"{where}.tool_calls[{j}]"))
            self.add("assistant", text, calls)
        elif role in ("tool", "function"):
            call_id = m.get("tool_call_id")
            name = m.get("name") or (self.tool_names.get(call_id) if isinstance(call_id, str) else None)
            self.add("tool", text, name=name)
        else:
            self.fail(f"{where}.role", f"unknown role {role!r} (expected system, developer, user, assistant or tool)")

    def openai_content(self, content: Any, where: str) -> str:
        if content is None or isinstance(content, str):
            return content or ""
        if not isinstance(content, list):
            self.fail(where, "must be a string or a list of content parts")
        parts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif kind in ("refusal",) and isinstance(part.get("refusal"), str):
                parts.append(part["refusal"])
            else:
                self.fail(f"{where}[{j}]", f"a {kind or 'non-text'} part; vkv compresses text only")
        return "\n".join(parts)

    def openai_call(self, call: Any, where: str) -> dict[str, Any]:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            self.fail(where, "expected {'function': {'name': ..., 'arguments': ...}}")
        arguments = function.get("arguments") or "{}"
        if isinstance(arguments, str):  # a JSON document of its own: the same rules as the file's
            arguments = _json(arguments, f"{self.source}: field {where}.function.arguments")
        if not isinstance(arguments, dict):
            self.fail(f"{where}.function.arguments", "is not a JSON object")
        if isinstance(call.get("id"), str):
            self.tool_names[call["id"]] = function["name"]
        return {"name": function["name"], "arguments": arguments}

    # ---- Anthropic Messages ---------------------------------------------------------------------
    def anthropic(self, data: Any) -> None:
        if not isinstance(data, dict) or not isinstance(data.get("messages"), list):
            self.fail("messages", "expected an object with a 'messages' list (a Messages request body)")
        if data.get("system"):
            self.add("system", self.anthropic_text(data["system"], "system"))
        for i, m in enumerate(data["messages"]):
            self.anthropic_message(m, f"messages[{i}]")

    def anthropic_message(self, m: Any, where: str) -> None:
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            self.fail(f"{where}.role", "expected a user or assistant message")
        content = m.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            self.fail(f"{where}.content", "must be a string or a list of content blocks")
        texts, calls = [], []
        for j, block in enumerate(blocks):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                text = block.get("text") or ""
                if not isinstance(text, str):
                    self.fail(f"{at}.text", f"must be a string, got {type(text).__name__}")
                texts.append(text)
            elif kind == "tool_use" and m["role"] == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                    self.fail(at, "a tool_use block needs a name and an input object")
                self.tool_names[str(block.get("id"))] = block["name"]
                calls.append({"name": block["name"], "arguments": block.get("input", {})})
            elif kind == "tool_result" and m["role"] == "user":
                if texts:  # keep the order: text written before a result is its own user message
                    self.add("user", "\n".join(texts))
                    texts = []
                result = self.anthropic_text(block.get("content") or "", f"{at}.content")
                prefix = "[error] " if block.get("is_error") else ""
                self.add("tool", prefix + result, name=self.tool_names.get(str(block.get("tool_use_id"))))
            elif kind in DROPPED_BLOCKS:
                self.skipped[f"{kind} blocks"] += 1
            else:
                self.fail(at, f"a {kind or 'malformed'} block in a {m['role']} message; vkv compresses text only")
        if texts or calls:
            self.add(m["role"], "\n".join(texts), calls)

    def anthropic_text(self, content: Any, where: str) -> str:
        if isinstance(content, str):
            return content
        if not isinstance(content, list):
            self.fail(where, "must be a string or a list of text blocks")
        texts = []
        for j, block in enumerate(content):
            if not (isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)):
                kind = block.get("type") if isinstance(block, dict) else None
                self.fail(f"{where}[{j}]", f"a {kind or 'malformed'} block; vkv compresses text only")
            texts.append(block["text"])
        return "\n".join(texts)

    # ---- JSON-lines session logs -----------------------------------------------------------------
    def log_line(self, record: Any, where: str) -> None:
        message = record.get("message") if isinstance(record, dict) else None
        if isinstance(message, dict) and "role" in message:
            record = message
        if not isinstance(record, dict) or "role" not in record:
            kind = record.get("type") if isinstance(record, dict) else type(record).__name__
            self.skipped[f"lines without a message ({kind})"] += 1
            return
        content, before = record.get("content"), len(self.messages)
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in BLOCKS_OF_ANTHROPIC for b in content
        ):
            self.anthropic_message(record, where)
        else:
            self.openai_message(record, where)
        # one response logged as several lines (a line per content block) is one assistant message
        same = record.get("id") is not None and record.get("id") == self.last_id
        if (
            same
            and before > 0
            and len(self.messages) == before + 1
            and self.messages[before - 1]["role"] == "assistant"
        ):
            part, whole = self.messages.pop(), self.messages[before - 1]
            whole["content"] = "\n".join(t for t in (whole["content"], part["content"]) if t)
            if part.get("tool_calls"):
                whole["tool_calls"] = whole.get("tool_calls", []) + part["tool_calls"]
        self.last_id = record.get("id")

    # ---- output -------------------------------------------------------------------------------------
    def add(self, role: str, text: str, calls: list | None = None, name: str | None = None) -> None:
        if not text.strip() and not calls:
            self.skipped["empty messages"] += 1
            return
        message: dict[str, Any] = {"role": role, "content": text}
        if calls:
            message["tool_calls"] = calls
        if name:
            message["name"] = name
        self.messages.append(message)
