"""`vkv compress`: a transcript span compressed by a registered KV method (Attention Matching by default, vkv's virtual
tokens with `--method vkv`), saved as a cache file."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

from vkv.cli.common import ModelConfig, console, key_value_table, load_model_from, tokenizer_for, write_json
from vkv.cli.method_flags import (
    add_recipe_and_method_args,
    build_method,
    given_options,
    method_class,
    recipe_flags_given,
    recipe_from_args,
)
from vkv.compress.budget import DEFAULT_METHOD, DEFAULT_RATIO, span_budget
from vkv.compress.sequential import MultiTurnConfig, compress_transcript_turns
from vkv.compress.single import compress_transcript, render_within_positions
from vkv.compress_api import compress_with
from vkv.errors import VkvError
from vkv.kv.file import STORES, read_header, save_cache
from vkv.kv.report import report_rows, report_table, storage
from vkv.methods import METHODS
from vkv.progress import clock, status, step_bar
from vkv.settings import add_arguments, from_args, nested, setting
from vkv.text.transcript import load_transcript, parse_turn_span, render
from vkv.text.windows import select_windows


@dataclass
class CompressCommand:
    """`vkv compress`'s own settings: the model, the span, its ratio and where the cache goes (the recipe's are
    CompressConfig's and MultiTurnConfig's)."""

    model: ModelConfig = nested(ModelConfig)
    method: str = setting(
        DEFAULT_METHOD,
        "any KV method of the registry, compressed as `vkv eval` does it (its options: `vkv eval --help`); vkv: "
        "vkv's virtual tokens (the recipe's flags below)",
        choices=lambda: kv_methods(),
    )
    ratio: float = setting(DEFAULT_RATIO, "span tokens per entry (above 1)", minimum=1, above=True)
    span: str | None = setting(None, "turns:A-B (inclusive message indices); default: all after the system message")
    window: int | None = setting(None, "compress one turn window of at most this many tokens", minimum=1)
    window_index: int = setting(
        0, "which of the windows that carry questions, in transcript order (0: the first)", minimum=0
    )
    out: str | None = setting(None, "cache file to write (.safetensors)", required=True)
    store: str = setting(
        "kv",
        "kv: every segment's keys and values; embeddings: verbatim token ids and virtual embeddings only, many times "
        "smaller, K/V rebuilt by forward passes when the file is loaded with the model",
        metavar="kv|embeddings",
    )
    json: str | None = setting(None, "also write the summary, config and per-layer loss here")


def kv_methods() -> tuple[str, ...]:
    """The registered methods that compress the KV cache (text methods prune the messages instead)."""
    from vkv.methods import METHODS, VKV_MODES
    from vkv.methods.base import TextMethod

    return tuple(n for n, cls in METHODS.items() if not issubclass(cls, TextMethod) and n not in VKV_MODES)


def cmd_compress(args: argparse.Namespace) -> int:
    command, plan = from_args(CompressCommand, args), recipe_from_args(args)
    given = given_options(args, [method_class(command.method, args)])
    if command.method != "vkv":
        return _compress_registered(command, args, plan, given)
    config = plan.compress
    check_store(command.store, plan)
    transcript = load_transcript(args.transcript)
    if config.pooling == "attention":
        raise VkvError("--pooling attention needs a question and is only available through `vkv eval`")
    torch.manual_seed(config.optim.seed)
    # the span's length, and so a ratio it cannot take, is known from the tokenizer before the model loads
    tokenizer = tokenizer_for(command.model.model, command.model.device)
    if command.window:
        transcript = _pick_window(tokenizer, transcript, command.window, command.window_index)
    turns = parse_turn_span(command.span, transcript)
    start, end = render(transcript, tokenizer).token_span(*turns)
    if not plan.auto_ratio:
        span_budget(end - start, command.ratio)
    lm, loading = timed_load(command)
    per_turn = bool(getattr(args, "per_turn", None))
    if per_turn or plan.keep_verbatim or plan.auto_ratio:
        return _compress_multiturn(command, lm, transcript, turns, plan, per_turn, loading)
    start = time.perf_counter()
    with step_bar(f"compressing {transcript.id} turns {turns[0]}-{turns[1] - 1}", config.optim.steps) as on_step:
        spliced = compress_transcript(lm, transcript, turns, command.ratio, config, on_step=on_step)
    save_with_store(spliced, command, lm, transcript)
    seconds = time.perf_counter() - start
    (virtual,) = [s for s in spliced.segments if s.kind != "verbatim"]  # compact with a per-head verbatim share
    summary = {
        "span_tokens": virtual.original_tokens,
        "entries_per_head": round(virtual.real_entries, 2),  # what the ratio counts
        "slots_per_head": virtual.entries,  # what the segment holds (head-wise budgets pad the heads that keep fewer)
        "ratio_achieved": round(virtual.ratio, 4),
        "initial_loss": virtual.stats.get("initial_loss"),  # none where no virtual token was tuned
        "best_loss": virtual.stats.get("best_loss"),
        "steps": virtual.stats["steps"],
        "stopped": virtual.stats["stopped"],
        "seconds": round(seconds, 2),  # wall time from the model loaded to the file written (print_seconds)
        "optimise_seconds": round(virtual.stats["seconds"], 2),  # of which the optimisation's steps
        "load_seconds": round(loading, 2),  # loading the model, before and not in `seconds`
        "seconds_per_step": round(virtual.stats["seconds_per_step"], 4),
        "cache": command.out,
        "store": command.store,
        **_memory(command.out),
    }
    console.print(key_value_table("vkv compress", summary))
    print_seconds(seconds, loading)
    write_json(
        command.json,
        {
            **summary,
            "ratio": command.ratio,
            "config": config.to_dict(),
            "segments": spliced.table(),
            "per_layer_loss": virtual.stats["per_layer_loss"],
        },
    )
    return 0


def _compress_registered(command: CompressCommand, args: argparse.Namespace, plan, given) -> int:
    """Any registered KV method, through the same steps as `vkv eval` (vkv.compress_api.compress_with)."""
    name, cls = command.method, METHODS[command.method]
    recipe_given = recipe_flags_given(args, set(given))  # a setting the method declares too is its own option
    if recipe_given and cls.recipe_class is None:
        raise VkvError(
            f"--{recipe_given[0].replace('_', '-')} is a setting of vkv's recipe, and method '{name}' has none "
            "(--method vkv takes it)"
        )
    if command.store != "kv":
        raise VkvError(f"--store embeddings is for vkv's virtual tokens (--method vkv), not method '{name}'")
    method = build_method(cls, plan, args, given)
    transcript = load_transcript(args.transcript)
    # the span's length, and so a ratio it cannot take, is known from the tokenizer before the model loads
    tokenizer = tokenizer_for(command.model.model, command.model.device)
    if command.window:
        transcript = _pick_window(tokenizer, transcript, command.window, command.window_index)
    turns = parse_turn_span(command.span, transcript)
    start, end = render(transcript, tokenizer).token_span(*turns)
    span_budget(end - start, command.ratio)
    lm, loading = timed_load(command)
    start = time.perf_counter()
    with status(f"compressing {transcript.id} turns {turns[0]}-{turns[1] - 1} by {name}"):
        spliced = compress_with(lm, transcript, turns, method, command.ratio, plan.compress.optim.seed)
    save_cache(spliced, command.out)
    seconds = time.perf_counter() - start
    rows = report_rows(read_header(command.out))
    console.print(report_table(rows))
    print_seconds(seconds, loading)
    write_json(
        command.json,
        {
            "method": name,
            "ratio": command.ratio,
            "seconds": round(seconds, 2),
            "load_seconds": round(loading, 2),
            "config": method.config(),
            "segments": spliced.table(),
            "report": rows,
        },
    )
    return 0


def _compress_multiturn(command: CompressCommand, lm, transcript, turns, plan, per_turn: bool, loading: float) -> int:
    start = time.perf_counter()
    with status(f"compressing {transcript.id} turns {turns[0]}-{turns[1] - 1} turn by turn"):
        spliced = compress_transcript_turns(lm, transcript, turns, command.ratio, plan, per_turn)
    save_with_store(spliced, command, lm, transcript)
    seconds = time.perf_counter() - start
    rows = report_rows(read_header(command.out))
    console.print(report_table(rows))
    print_seconds(seconds, loading)
    write_json(
        command.json,
        {
            "ratio": command.ratio,
            "seconds": round(seconds, 2),
            "load_seconds": round(loading, 2),
            "config": plan.to_dict(),
            "segments": spliced.table(),
            "report": rows,
        },
    )
    return 0


def timed_load(command: CompressCommand):
    """The model, and the seconds its load took (said apart from the compression's own)."""
    began = time.perf_counter()
    lm = load_model_from(command.model)
    return lm, time.perf_counter() - began


def print_seconds(seconds: float, loading: float) -> None:
    """What the command's time went to, each part named: the compression's wall time (every stage from the prefill to
    the written file, as the JSON's `seconds`) and the model's load before it (`load_seconds`)."""
    console.print(
        f"compressed and written in {clock(seconds)} ({seconds:.1f} s wall, from the prefill to the written file); "
        f"the model loaded in {loading:.1f} s before that"
    )


def _memory(path: str) -> dict:
    """What the written cache takes when it decodes: the whole cache's bytes, the compressed segments' and the ratio in
    memory (from its header's counts, as `vkv inspect` gives them)."""
    stored = storage(path, read_header(path))
    keys = ("memory_bytes", "compressed_memory_bytes", "ratio_memory")
    return {k: stored[k] for k in keys if k in stored}


def check_store(store: str, plan: MultiTurnConfig) -> None:
    """Refuse a --store value, or a multi-turn plan whose segments it cannot hold, before any work is done."""
    if store not in STORES:
        raise VkvError(f"--store {store!r}: choose kv (keys and values) or embeddings (K/V rebuilt at load)")
    if store == "kv":
        return
    if plan.keep_verbatim:
        raise VkvError(
            "--store embeddings cannot hold --keep-verbatim (per-turn verbatim) segments, whose kept tokens' K/V saw the whole turn"
        )
    if plan.compress.verbatim_share:
        raise VkvError(
            f"--store embeddings cannot hold segments with a per-head verbatim share (--verbatim-share "
            f"{plan.compress.verbatim_share:g}, the default recipe's): each head keeps its own entries, which no "
            "forward pass rebuilds; use --store kv, or --verbatim-share 0 for virtual tokens alone"
        )
    if plan.auto_ratio and plan.target_source == "oracle":
        raise VkvError(
            "--store embeddings with --auto-ratio needs --target-source online: a turn kept verbatim under oracle "
            "targets has K/V from the uncompressed history, which a rebuild cannot reproduce"
        )


def save_with_store(spliced, command: CompressCommand, lm, transcript) -> None:
    """Write the cache as --store says; an embeddings-only file needs the rendered ids of its verbatim segments."""
    ids = render_within_positions(lm, transcript).ids if command.store == "embeddings" else None
    save_cache(spliced, command.out, store=command.store, ids=ids)


def _pick_window(tokenizer, transcript, max_tokens: int, index: int):
    """The index-th of a transcript's windows that carry questions, in transcript order."""
    windows = select_windows(transcript, render(transcript, tokenizer), max_tokens)
    if not 0 <= index < len(windows):
        raise VkvError(f"--window-index {index}: {transcript.path} has {len(windows)} windows with questions")
    return windows[index]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compress", help="compress a transcript span (virtual tokens, or any KV method); save a cache file"
    )
    p.set_defaults(run=cmd_compress, outputs=("out", "json"))
    p.add_argument("transcript")
    add_arguments(p, CompressCommand)
    add_recipe_and_method_args(p)
