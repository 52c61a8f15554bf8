"""`vkv chat`: continue a saved session, a compressed transcript's cache, or a transcript, interactively or from
a pipe.

Each exchange is appended to the session's running cache; with `--compress-every N`, every N finished messages are
compressed by the session's recipe (vkv's virtual tokens, message by message); `/save FILE` writes the session,
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

from vkv.cli.chat_loop import Chat
from vkv.cli.common import ModelConfig, console, load_model_from, recorded_transcript, trust_foreign_setting
from vkv.cli.method_flags import add_recipe_args, recipe_from_args
from vkv.compress.budget import DEFAULT_RATIO
from vkv.compress.session import Session, message_dict
from vkv.errors import VkvError
from vkv.kv.file import trusted_header
from vkv.lm.load import resolve_model_path
from vkv.lm.rebuild import load_cache
from vkv.settings import add_arguments, from_args, nested, setting
from vkv.text.transcript import load_transcript


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
        0, "compress the verbatim messages once this many have accumulated (0: never)", minimum=0
    )
    ratio: float = setting(DEFAULT_RATIO, "the ratio --compress-every compresses at", minimum=1, above=True)
    trust_foreign: bool = trust_foreign_setting()


def open_session(source: str, lm, recipe, trust_foreign: bool = False):
    """A saved session (.safetensors written by Session.save or /save; it keeps its own recipe), or a new one holding
    a transcript's messages verbatim and compressing with `recipe` (a MultiTurnConfig). A cache file not signed with
    this user's key is refused unless `trust_foreign`."""
    path = Path(source)
    if path.suffix == ".json":
        session = Session(lm, recipe)
        session.extend([message_dict(m) for m in load_transcript(path).messages])
        return session
    header = trusted_header(path, trust_foreign)
    if "session" in header:
        return Session.load(path, lm, trust_foreign)
    return Session.continuing(lm, recorded_transcript(path, header), load_cache(path, lm, trust_foreign))


def cmd_chat(args: argparse.Namespace) -> int:

    config = from_args(ChatConfig, args)
    model = config.model
    inputs = {args.source: "the chat's source"}
    if Path(args.source).suffix != ".json":  # a cache file: refused before any model loads unless it is trusted
        header = trusted_header(args.source, config.trust_foreign)
        if model.model is None:  # it names its model
            model = dataclasses.replace(model, model=header.get("model"))
    lm = load_model_from(model)  # a transcript gets the default model
    # a chat keeps no uncompressed history, so its turns' targets come from the running cache
    recipe = dataclasses.replace(recipe_from_args(args), target_source="online")
    session = open_session(args.source, lm, recipe, config.trust_foreign)
    if config.compress_every and not session.per_message:
        raise VkvError(
            f"{args.source}: --compress-every needs a cache with one segment per message (a session or a transcript); "
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


def register(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("chat", help="continue a saved session (or a transcript) interactively or from a pipe")
    p.set_defaults(run=cmd_chat)
    p.add_argument("source", help="a session file (.safetensors, from /save or Session.save) or a transcript (.json)")
    add_arguments(p, ChatConfig)
    add_recipe_args(p, skip=("target_source",))  # a new session's recipe (a saved session keeps its own)
