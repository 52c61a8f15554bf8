"""`vkv render`: a transcript as the model sees it, with its per-message token spans.

The transcript is the positional argument (hand-written: it is not a setting); every flag is a field of
`RenderConfig`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rich.table import Table

from vkv.cli.common import console, tokenizer_for, write_json
from vkv.settings import add_arguments, from_args, setting
from vkv.text.transcript import load_transcript, render


@dataclass
class RenderConfig:
    model: str | None = setting(None, "model whose tokenizer and chat template to use (default: vkv's default model)")
    json: str | None = setting(None, "also write the span table, with each message's token ids, to this file")


def cmd_render(args: argparse.Namespace) -> int:

    config = from_args(RenderConfig, args)
    transcript = load_transcript(args.transcript)
    lm_tokenizer = tokenizer_for(config.model)
    rendered = render(transcript, lm_tokenizer)  # any length: the spans say where to cut windows for the model
    table = Table(title=f"{transcript.id}: {len(rendered.ids)} tokens, {len(rendered.spans)} messages")
    for col, justify in (
        ("turn", "right"),
        ("role", "left"),
        ("start", "right"),
        ("end", "right"),
        ("tokens", "right"),
        ("first words", "left"),
    ):
        table.add_column(col, justify=justify)
    for span, message in zip(rendered.spans, transcript.messages):
        words = " ".join(message.content.split())[:60]
        table.add_row(str(span.turn), span.role, str(span.start), str(span.end), str(span.length), words)
    console.print(table)
    tiles = (
        rendered.spans[0].start == 0
        and rendered.spans[-1].end == len(rendered.ids)
        and all(a.end == b.start for a, b in zip(rendered.spans, rendered.spans[1:]))
    )
    notes = []
    if rendered.inlined_tool_calls:
        notes.append("the chat template drops tool_calls, so they are rendered into the message text")
    if rendered.tool_role_as != "tool":
        notes.append(f"the chat template has no tool role, so tool messages render as {rendered.tool_role_as}")
    for n in notes:
        console.print(f"note: {n}")
    console.print(f"spans tile the {len(rendered.ids)} ids: {'yes' if tiles else 'NO'}")
    write_json(
        config.json,
        {
            "transcript": transcript.id,
            "tokens": len(rendered.ids),
            "spans": [{**vars(s), "ids": rendered.ids[s.start : s.end]} for s in rendered.spans],
        },
    )
    return 0 if tiles else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("render", help="render a transcript and print its per-message token spans")
    p.set_defaults(run=cmd_render, outputs=("json",))
    p.add_argument("transcript")
    add_arguments(p, RenderConfig)
