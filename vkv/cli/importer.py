"""`vkv import`: a conversation in a standard format (OpenAI, Anthropic, an agent's JSON-lines log) as a transcript."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from vkv.cli.common import console, key_value_table
from vkv.io import read_input, write_json_atomic
from vkv.settings import add_arguments, from_args, setting
from vkv.text.formats import FORMATS, import_conversation


@dataclass
class ImportConfig:
    format: str = setting(
        "openai",
        "the file's format: openai (chat-completions messages), anthropic (a Messages request body) or jsonl-log "
        "(one message, or an envelope holding one under 'message', per line)",
        choices=FORMATS,
    )
    out: str | None = setting(None, "transcript file to write (.json)", required=True)
    id: str | None = setting(None, "the transcript's id (default: the file's name without its extension)")


def cmd_import(args: argparse.Namespace) -> int:
    config = from_args(ImportConfig, args)
    read_input(args.file, "file to import")  # a device, FIFO, directory or oversized file: refused before parsing
    imported = import_conversation(args.file, config.format, config.id)
    write_json_atomic(config.out, imported.transcript, "transcript", "--out")
    messages = imported.transcript["messages"]
    roles = {role: sum(m["role"] == role for m in messages) for role in ("system", "user", "assistant", "tool")}
    summary = {
        "messages": len(messages),
        **{f"{role} messages": n for role, n in roles.items() if n},
        "tool calls": sum(len(m.get("tool_calls", [])) for m in messages),
        **{f"skipped {what}": n for what, n in imported.skipped.items()},
        "questions": "none (vkv eval needs them; compress, chat and ask do not)",
        "written": config.out,
    }
    console.print(key_value_table(f"vkv import {args.file} ({config.format})", summary))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="read an OpenAI, Anthropic or JSON-lines conversation into a transcript file")
    p.set_defaults(run=cmd_import, outputs=("out",))
    p.add_argument("file")
    add_arguments(p, ImportConfig)
