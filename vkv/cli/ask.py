"""`vkv ask`: answer a question from a compressed cache.

The cache file is the positional argument (hand-written: it is not a setting); every flag is a field of `AskConfig`."""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass

from vkv.cli.common import (
    ModelConfig,
    console,
    errors,
    load_model_from,
    recorded_transcript,
    trust_foreign_setting,
    write_json,
)
from vkv.errors import VkvError
from vkv.kv.file import trusted_header
from vkv.lm.context import Context
from vkv.lm.rebuild import load_cache
from vkv.settings import add_arguments, from_args, nested, setting
from vkv.text.transcript import followup, render

MAX_ANSWER_TOKENS = 4096  # an answer from a cache is a few sentences; more is a mistyped flag, not a question


@dataclass
class AskConfig:
    model: ModelConfig = nested(ModelConfig)
    question: str | None = setting(None, "the question to answer", required=True)
    answer_prefix: str = setting("", "text the answer starts with")
    transcript: str | None = setting(None, "the transcript the cache was built from (default: recorded path)")
    max_new_tokens: int = setting(
        32, f"longest answer, in tokens (at most {MAX_ANSWER_TOKENS})", minimum=1, below=MAX_ANSWER_TOKENS + 1
    )
    max_seconds: float = setting(
        120.0, "stop answering after this many seconds and print what the answer has so far", minimum=0, above=True
    )
    json: str | None = setting(None, "also write the question and answer here")
    trust_foreign: bool = trust_foreign_setting()


def cmd_ask(args: argparse.Namespace) -> int:

    config = from_args(AskConfig, args)
    if not config.question.strip():  # before any file is read or model loaded
        raise VkvError("--question: is empty; give the question to answer")
    header = trusted_header(args.cache, config.trust_foreign)  # a foreign file is refused before any model loads
    model = config.model
    if model.model is None:
        model = dataclasses.replace(model, model=header.get("model"))
    transcript = recorded_transcript(args.cache, header, config.transcript)  # refused before any rebuild is run
    lm = load_model_from(model)
    spliced = load_cache(args.cache, lm, config.trust_foreign)
    rendered = render(transcript, lm.tokenizer)
    prompt, _ = followup(lm.tokenizer, rendered, transcript, config.question, config.answer_prefix)
    deadline = time.monotonic() + config.max_seconds
    tokens = Context(lm, spliced).greedy(prompt, config.max_new_tokens, deadline)
    answer = lm.tokenizer.decode(tokens, skip_special_tokens=True)
    console.print(f"[bold]Q:[/] {config.question}")
    console.print(f"[bold]A:[/] {config.answer_prefix}{answer}")
    if len(tokens) < config.max_new_tokens and time.monotonic() >= deadline:
        errors.print(
            f"note: answering reached the {config.max_seconds:g} s bound (--max-seconds) after {len(tokens)} tokens, "
            "so the answer may be cut short"
        )
    write_json(config.json, {"question": config.question, "answer": answer, "cache": args.cache})
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ask", help="answer a question from a compressed cache")
    p.set_defaults(run=cmd_ask, outputs=("json",))
    p.add_argument("cache")
    add_arguments(p, AskConfig)
