"""`vkv chat`: continue a saved session, a compressed transcript's cache, or a transcript, interactively or from
a pipe.

Each exchange is appended to the session's running cache; with `--compress-every N`, every N new messages are
compressed by `--method` (Attention Matching unless told; vkv's virtual tokens by the recipe's flags with `--method
vkv`), message by message onto the running cache, and `/compress` does it at once; `/save FILE` writes the session,
`/undo` and `/retry` take back the last exchange. From a pipe (`echo question | vkv chat ...`) every line is a
question and only the answers are printed. The conversation itself (reading, answering, leaving) is vkv.cli.chat_loop.

The source file is the positional argument (hand-written: it is not a setting); the flags are the fields of
`ChatConfig` and the compression recipe's (`add_compress_args`, vkv.cli.compress).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from vkv.api.session import Session, session_method
from vkv.cli.chat_loop import Chat
from vkv.cli.common import ModelConfig, console, load_model_from, recorded_transcript, trust_foreign_setting
from vkv.cli.compress import kv_methods
from vkv.cli.method_flags import add_recipe_args, recipe_flags_given, recipe_from_args
from vkv.compress.budget import DEFAULT_METHOD, DEFAULT_RATIO
from vkv.compress.recipe import VkvRecipe
from vkv.errors import VkvError
from vkv.kv.file import trusted_header
from vkv.lm.load import resolve_model_path
from vkv.lm.rebuild import load_cache
from vkv.methods import METHODS, get_method
from vkv.settings import add_arguments, from_args, nested, setting
from vkv.text.formats import load_conversation


@dataclass
class ChatConfig:
    model: ModelConfig = nested(ModelConfig)
    temperature: float = setting(
        0.0,
        "0: greedy; above 0: sampling at this temperature (either way an answer that starts to repeat itself is stopped "
        "and kept up to the loop)",
        minimum=0,
    )
    max_new_tokens: int = setting(256, "longest answer, in tokens", minimum=1)
    compress_every: int = setting(
        0,
        "compress the chat's new messages (those since it opened or last compressed) once this many have accumulated "
        "(0: never; /compress does it at once)",
        minimum=0,
    )
    method: str | None = setting(
        None,
        f"how --compress-every and /compress compress: any KV method with a budget, or vkv (virtual tokens by the "
        f"recipe's flags); default: {DEFAULT_METHOD} for a transcript, a saved session's own for a session",
        choices=lambda: kv_methods(),
    )
    ratio: float = setting(DEFAULT_RATIO, "the ratio --compress-every and /compress compress at", minimum=1, above=True)
    trust_foreign: bool = trust_foreign_setting()


def open_session(source: str, lm, trust_foreign: bool = False, method=None):
    """A saved session (.safetensors written by Session.save or /save; it keeps its own method unless `method` is
    given), or a new one holding a conversation's messages verbatim (a vkv transcript or an export
    `vkv.load_conversation` reads) and compressing by `method` (default: DEFAULT_METHOD). A cache file not signed
    with this user's key is refused unless `trust_foreign`."""
    path = Path(source)
    if path.suffix in (".json", ".jsonl"):
        session = Session(lm, method or DEFAULT_METHOD)
        session.extend(list(load_conversation(path).messages))
        return session
    header = trusted_header(path, trust_foreign)
    if "session" in header:
        session = Session.load(path, lm, trust_foreign)
        if method is not None:
            session.method = session_method(method)
        return session
    return Session.continuing(lm, recorded_transcript(path, header), load_cache(path, lm, trust_foreign))


def cmd_chat(args: argparse.Namespace) -> int:

    config = from_args(ChatConfig, args)
    check_method_flags(config, args)
    model = config.model
    inputs = {args.source: "the chat's source"}
    if Path(args.source).suffix not in (
        ".json",
        ".jsonl",
    ):  # a cache file: refused before any model loads unless it is trusted
        header = trusted_header(args.source, config.trust_foreign)
        if model.model is None:  # it names its model
            model = dataclasses.replace(model, model=header.get("model"))
    lm = load_model_from(model)  # a transcript gets the default model
    # a chat keeps no uncompressed history, so its turns' targets come from the running cache
    recipe = dataclasses.replace(recipe_from_args(args), target_source="online")
    method = None
    if config.method is not None:
        by_recipe = METHODS[config.method].recipe_class is VkvRecipe
        method = get_method(config.method, recipe=recipe) if by_recipe else get_method(config.method)
    session = open_session(args.source, lm, config.trust_foreign, method)
    if config.compress_every and not session.by_messages:
        raise VkvError(
            f"{args.source}: --compress-every needs a cache of whole messages (a session or a transcript); "
            "this is a compressed transcript's cache"
        )
    interactive = sys.stdin.isatty()
    sampling = {"do_sample": config.temperature > 0, "max_new_tokens": config.max_new_tokens}
    if config.temperature > 0:
        sampling["temperature"] = config.temperature
    if interactive:
        console.print(
            f"{len(session.messages)} messages, {session.memory_bytes / 2**20:.1f} MiB of cache; /help lists commands"
        )
    path, local = resolve_model_path(lm.name)
    if local:
        inputs[path] = "the model directory"
    return Chat(session, sampling, interactive, config.compress_every, config.ratio, inputs=inputs).run()


def check_method_flags(config: ChatConfig, args: argparse.Namespace) -> None:
    """Refuse, before the model loads, a flag of vkv's recipe given to a chat that compresses by another method (a
    saved session's method is known only once it is read: its recipe flags are left to the session's own)."""
    given = recipe_flags_given(args, {"target_source"})
    method = config.method or (DEFAULT_METHOD if Path(args.source).suffix in (".json", ".jsonl") else None)
    if given and method is not None and METHODS[method].recipe_class is not VkvRecipe:
        raise VkvError(
            f"--{given[0].replace('_', '-')} is a setting of vkv's recipe, and method '{method}' has none "
            "(--method vkv takes it)"
        )


def register(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("chat", help="continue a saved session (or a transcript) interactively or from a pipe")
    p.set_defaults(run=cmd_chat)
    p.add_argument("source", help="a session file (.safetensors, from /save or Session.save) or a transcript (.json)")
    add_arguments(p, ChatConfig)
    add_recipe_args(p, skip=("target_source",))  # a new session's recipe (a saved session keeps its own)
