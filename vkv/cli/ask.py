"""`vkv ask`: answer a question from a compressed cache."""

from __future__ import annotations

import argparse

from vkv.cli.common import add_model_args, console, load_from_args, recorded_transcript, write_json
from vkv.settings import bounded


def cmd_ask(args: argparse.Namespace) -> int:
    from vkv.kv.file import read_header
    from vkv.lm.context import Context
    from vkv.lm.rebuild import load_cache
    from vkv.text.transcript import followup, render

    header = read_header(args.cache)
    if args.model is None:
        args.model = header.get("model")
    transcript = recorded_transcript(args.cache, header, args.transcript)  # refused before any rebuild is run
    lm = load_from_args(args)
    spliced = load_cache(args.cache, lm)
    rendered = render(transcript, lm.tokenizer)
    prompt, _ = followup(lm.tokenizer, rendered, transcript, args.question, args.answer_prefix or "")
    answer = lm.tokenizer.decode(Context(lm, spliced).greedy(prompt, args.max_new_tokens), skip_special_tokens=True)
    console.print(f"[bold]Q:[/] {args.question}")
    console.print(f"[bold]A:[/] {(args.answer_prefix or '')}{answer}")
    write_json(args.json, {"question": args.question, "answer": answer, "cache": args.cache})
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer a question from a compressed cache")
    p.set_defaults(run=cmd_ask, outputs=("json",))
    p.add_argument("cache")
    add_model_args(p)
    p.set_defaults(model=None)
    p.add_argument("--question", required=True)
    p.add_argument("--answer-prefix", default="", help="text the answer starts with")
    p.add_argument("--transcript", help="the transcript the cache was built from (default: recorded path)")
    p.add_argument("--max-new-tokens", type=bounded(int, 1), default=32)
    p.add_argument("--json")
