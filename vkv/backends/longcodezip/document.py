"""Building the unit tree (units.py) of a text: along the syntax tree for code, into lines for prose."""

from __future__ import annotations

from vkv.backends.longcodezip.prose import add_prose_units
from vkv.backends.longcodezip.syntax import add_syntax_units
from vkv.backends.longcodezip.units import Document, UnitBuilder
from vkv.backends.source.languages import Language
from vkv.backends.source.lines import split_lines


def parse_document(text: str, language: Language) -> Document:
    """Split `text` into its unit tree: along the syntax tree for code, into lines for prose."""
    lines = split_lines(text, line_feed_only=True)
    builder = UnitBuilder(lines, language)
    if language.grammar is not None:
        add_syntax_units(builder, lines, 0, 0, language)
    else:
        add_prose_units(builder, lines, 0, 0, language)
    return builder.finish()


def parse_messages(messages: list[str], language: Language) -> Document:
    """One document from a conversation: each message a unit of its own, its text split as prose."""
    text = "".join(m if m.endswith("\n") or not m else m + "\n" for m in messages)
    lines = split_lines(text, line_feed_only=True)
    builder = UnitBuilder(lines, language)
    spans, children, cursor = [], [], 0
    for index, message in enumerate(messages):
        count = len(split_lines(message, line_feed_only=True))
        spans.append((cursor, cursor + count))
        if count:
            first = message.strip().splitlines()[0][:60] if message.strip() else ""
            uid = builder.add_unit(0, cursor, cursor + count - 1, "message", f"message {index}: {first}", language.name)
            add_prose_units(builder, lines[cursor : cursor + count], cursor, uid, language)
            children.append(uid)
        cursor += count
    builder.add_body(0, children, needs_statement=False)
    return builder.finish(messages=spans)
