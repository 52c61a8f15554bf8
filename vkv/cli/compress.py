"""`vkv compress`: a transcript span compressed by a registered KV method (Attention Matching by default, vkv's virtual
tokens with `--method vkv`), saved as a cache file."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from vkv.api.compress import compress_with
from vkv.cli.common import ModelConfig, console, key_value_table, load_model_from, tokenizer_for, write_json
from vkv.cli.method_flags import (
    add_recipe_and_method_args,
    build_method,
    given_options,
    method_class,
    recipe_flags_given,
    recipe_from_args,
    refuse_unused_recipe_flags,
)
from vkv.compress.budget import DEFAULT_METHOD, DEFAULT_RATIO, span_budget
from vkv.compress.recipe import VkvRecipe
from vkv.compress.span import render_within_positions
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
    """`vkv compress`'s own settings: the model, the span, its ratio and where the cache goes (vkv's recipe's are
    VkvRecipe's, the methods' options their own)."""

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
    from vkv.methods.base import TextMethod

    return tuple(n for n, cls in METHODS.items() if not issubclass(cls, TextMethod))


def cmd_compress(args: argparse.Namespace) -> int:
    command, plan = from_args(CompressCommand, args), recipe_from_args(args)
    cls = method_class(command.method, args)
    given = given_options(args, [cls])
    recipe_given = recipe_flags_given(args, set(given))  # a setting the method declares too is its own option
    if recipe_given and cls.recipe_class is None:
        raise VkvError(
            f"--{recipe_given[0].replace('_', '-')} is a setting of vkv's recipe, and method '{cls.name}' has none "
            "(--method vkv takes it)"
        )
    refuse_unused_recipe_flags(args, [cls])
    method = build_method(cls, plan, args, given)
    check_store(command.store, method)
    transcript = load_transcript(args.transcript)
    # the span's length, and so a ratio it cannot take, is known from the tokenizer before the model loads
    tokenizer = tokenizer_for(command.model.model, command.model.device)
    if command.window:
        transcript = _pick_window(tokenizer, transcript, command.window, command.window_index)
    turns = parse_turn_span(command.span, transcript)
    start, end = render(transcript, tokenizer).token_span(*turns)
    if not method.chooses_ratio:
        span_budget(end - start, command.ratio)
    lm, loading = timed_load(command)
    started = time.perf_counter()
    label = f"compressing {transcript.id} turns {turns[0]}-{turns[1] - 1} by {cls.name}"
    looped = getattr(method, "looped", False)  # a loop's steps are per message or chunk, not one bar
    steps = plan.compress.optim.steps if cls.reports_steps and not (looped or method.chooses_ratio) else 0
    with step_bar(label, steps) if steps else status(label) as on_step:
        spliced = compress_with(lm, transcript, turns, method, command.ratio, plan.compress.optim.seed, on_step)
    save_with_store(spliced, command, lm, transcript)
    seconds = time.perf_counter() - started
    rows = report_rows(read_header(command.out))
    console.print(report_table(rows))
    whole = cls.recipe_class is VkvRecipe and not (looped or method.chooses_ratio)  # one segment of virtual tokens
    summary = _virtual_summary(next(s for s in spliced.segments if s.kind != "verbatim")) if whole else {}
    if summary:
        console.print(key_value_table("virtual tokens", summary))
    print_seconds(seconds, loading)
    write_json(
        command.json,
        {
            "method": cls.name,
            "ratio": None if method.chooses_ratio else command.ratio,
            "seconds": round(seconds, 2),  # from the prefill to the written file (print_seconds)
            "load_seconds": round(loading, 2),  # loading the model, before and not in `seconds`
            **summary,
            "cache": command.out,
            "store": command.store,
            **_memory(command.out),
            "config": method.config(),
            "segments": spliced.table(),
            "report": rows,
        },
    )
    return 0


def _virtual_summary(virtual) -> dict:
    """What the optimiser did for a whole span's virtual tokens: the span, the entries the ratio counts and the slots
    the segment holds, the V loss before and after, and where the optimisation's time went."""
    return {
        "span_tokens": virtual.original_tokens,
        "entries_per_head": round(virtual.real_entries, 2),  # what the ratio counts
        "slots_per_head": virtual.slots,  # what the segment holds (head-wise budgets pad the heads that keep fewer)
        "ratio_achieved": round(virtual.ratio, 4),
        "initial_loss": virtual.stats.get("initial_loss"),  # none where no virtual token was tuned
        "best_loss": virtual.stats.get("best_loss"),
        "steps": virtual.stats["steps"],
        "stopped": virtual.stats["stopped"],
        "optimise_seconds": round(virtual.stats["seconds"], 2),  # the optimisation's steps, of the whole
        "seconds_per_step": round(virtual.stats["seconds_per_step"], 4),
        "per_layer_loss": virtual.stats["per_layer_loss"],
    }


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


def check_store(store: str, method) -> None:
    """Refuse a --store value, or a method whose segments it cannot hold, before any work is done."""
    if store not in STORES:
        raise VkvError(f"--store {store!r}: choose kv (keys and values) or embeddings (K/V rebuilt at load)")
    if store == "kv":
        return
    if method.recipe_class is not VkvRecipe:
        raise VkvError(f"--store embeddings is for vkv's virtual tokens (--method vkv), not method '{method.name}'")
    recipe = method.settings()
    if recipe.shared_tokens:
        raise VkvError(
            f"--store embeddings cannot hold --verbatim {recipe.verbatim} segments, whose kept tokens' K/V saw the whole span"
        )
    if recipe.per_head:
        raise VkvError(
            f"--store embeddings cannot hold segments with a per-head verbatim share (--verbatim-share "
            f"{recipe.compress.verbatim_share:g}, the default recipe's): each head keeps its own entries, which no "
            "forward pass rebuilds; use --store kv, or --verbatim none for virtual tokens alone"
        )
    if recipe.auto_ratio and recipe.target_source == "oracle":
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
