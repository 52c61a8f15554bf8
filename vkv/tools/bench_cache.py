"""`vkv bench cache`: what a compressed cache costs when it decodes, padded (every KV head as long as the longest,
the layout before ragged caches) against ragged (each head its own entries), against the uncompressed window, and
against the reference every figure is read beside: plain transformers, the model's own `generate()` over a DynamicCache
holding the whole window, with the model's own attention.

One process, one model: for each window and each method and ratio, the window's span is compressed once; then each
layout is built from the same segments and answers the same question prompt followed by a fixed number of greedy
tokens (no early stop). Reported per layout: the bytes of the cache object (whole, and for the span's entries), the
peak memory of building it, the question and the generation (peak RSS on CPU, peak allocation on CUDA, above what
was held before), and the decode time per generated token. Layouts are run in alternation, several rounds, and
each figure is the median, so a machine whose load drifts slows every contender alike; ratios between layouts are
what to read.
"""

from __future__ import annotations

import copy
import gc
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.io import write_json_atomic
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM
from vkv.lm.ragged_attention import IMPLEMENTATIONS
from vkv.lm.splice import splice
from vkv.methods import get_method
from vkv.progress import counted
from vkv.settings import check_ranges, nested, setting
from vkv.text.transcript import load_transcript, render
from vkv.text.windows import turn_windows, window_transcript
from vkv.tools.bench_model import BenchModel
from vkv.tools.measure import working_memory

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TRANSCRIPT = ROOT / "transcripts" / "dev" / "gen-ci-failure-2.json"
QUESTION = (
    "Before we continue: list every file you changed in this session, the exact commands you ran to test them, "
    "and which of those commands failed and why."
)
LAYOUTS = ("full", "padded", "ragged")  # vkv's caches; "transformers" is measured beside them


def pick_window(lm: FrozenLM, path: Path, tokens: int):
    """The window of `path` (system message plus consecutive turns) closest to `tokens` tokens without exceeding
    them by more than one message: turn windows of that budget, the longest one."""
    transcript = load_transcript(path)
    rendered = render(transcript, lm.tokenizer)
    windows = turn_windows(transcript, rendered, tokens)
    first, last = max(windows, key=lambda w: rendered.token_span(*w)[1] - rendered.token_span(*w)[0])
    window = window_transcript(transcript, first, last)
    return window, render(window, lm.tokenizer)


def question_ids(lm: FrozenLM, length: int) -> list[int]:
    """`length` ids of a user question (the fixed QUESTION, repeated if short), as a prompt after the window."""
    ids = lm.tokenizer(QUESTION, add_special_tokens=False)["input_ids"]
    return (ids * (length // len(ids) + 1))[:length]


def decode(lm: FrozenLM, context: Context, prompt: list[int], new_tokens: int) -> list[float]:
    """Feed the prompt, then `new_tokens` greedy tokens one at a time; seconds of each single-token step."""
    logits = context.feed(prompt)[-1]
    times = []
    for _ in range(new_tokens):
        token = int(logits.argmax())
        if context.lm.device.type == "cuda":
            torch.cuda.synchronize(context.lm.device)
        started = time.perf_counter()
        logits = context.feed([token])[-1]
        if context.lm.device.type == "cuda":
            torch.cuda.synchronize(context.lm.device)
        times.append(time.perf_counter() - started)
    return times


def measure_layout(lm: FrozenLM, spliced, start: int, end: int, padded: bool, prompt: list[int], new: int) -> dict:
    """Build the layout's cache, ask, generate: bytes, peak memory and decode seconds per token."""
    with working_memory(lm.device) as peak:
        context = Context(lm, spliced, padded=padded)
        cache_bytes, span_bytes = context.cache.nbytes, context.cache.span_nbytes(start, end)
        times = decode(lm, context, prompt, new)
        del context
    return {
        "cache_bytes": cache_bytes,
        "span_bytes": span_bytes,
        "peak_mb": peak["mb"],
        "decode_ms_per_token": 1000 * statistics.median(times),
    }


@contextmanager
def own_attention(model) -> Iterator[None]:
    """The model's attention as transformers ships it (sdpa or eager, not vkv's wrapper of it) for the block."""
    current = model.config._attn_implementation
    base = IMPLEMENTATIONS.get(current, (None, current))[1]
    if base != current:
        model.set_attn_implementation(base)
    try:
        yield
    finally:
        if base != current:
            model.set_attn_implementation(current)


def measure_transformers(
    lm: FrozenLM, window_ids: list[int], start: int, end: int, prompt: list[int], new: int
) -> dict:
    """Plain transformers on the same window: a prefill into a DynamicCache, then the model's own `generate()` of the
    prompt and `new` greedy tokens (no early stop). Decode time per token is the difference between generating
    `new` + 1 tokens and 1 token (the prompt's prefill and first token cancel), over `new`."""
    model, ids = lm.model, torch.tensor([window_ids + prompt], device=lm.device)

    def generate(cache, tokens: int) -> float:
        _sync(lm.device)
        started = time.perf_counter()
        model.generate(
            ids, **lm.with_cache(copy.deepcopy(cache)), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
        )
        _sync(lm.device)
        return time.perf_counter() - started

    with own_attention(model), torch.no_grad(), working_memory(lm.device) as peak:
        cache = model(input_ids=ids[:, : len(window_ids)], use_cache=True).past_key_values
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        cache_bytes = sum(k.nbytes + v.nbytes for k, v in layers)
        span_bytes = sum(k[:, :, start:end].nbytes + v[:, :, start:end].nbytes for k, v in layers)
        seconds = generate(cache, new + 1) - generate(cache, 1)
    return {
        "cache_bytes": cache_bytes,
        "span_bytes": span_bytes,
        "peak_mb": peak["mb"],
        "decode_ms_per_token": 1000 * seconds / new,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_window(lm: FrozenLM, path: Path, tokens: int, config: CacheBenchConfig, log) -> list[dict]:
    """Every method and ratio of `config` on the window of `path` nearest `tokens` tokens, each layout measured in
    alternation for `config.rounds` rounds."""
    window, rendered = pick_window(lm, path, tokens)
    start, end = rendered.token_span(*window.default_span())
    work = SpanWork.capture(lm, rendered.ids, start, end, rendered.message_starts, rendered.message_roles, config.seed)
    prompt = question_ids(lm, config.question_tokens)
    log(f"window {window.id}: {len(rendered.ids)} tokens, span {start}-{end} ({end - start} tokens)")
    full = splice(lm, work.kv, start, end, work.keep(list(range(end - start))), [])
    records = []
    for method_name in config.methods:
        for ratio in config.ratios:
            method = get_method(method_name)
            started = time.perf_counter()
            spliced = splice(lm, work.kv, start, end, method.compress(work, ratio), [])
            seconds = time.perf_counter() - started
            runs: dict[str, list[dict]] = {layout: [] for layout in (*LAYOUTS, "transformers")}
            for _ in range(config.rounds):
                for layout in LAYOUTS:
                    cache = full if layout == "full" else spliced
                    gc.collect()
                    runs[layout].append(
                        measure_layout(lm, cache, start, end, layout == "padded", prompt, config.new_tokens)
                    )
                gc.collect()
                runs["transformers"].append(
                    measure_transformers(lm, rendered.ids, start, end, prompt, config.new_tokens)
                )
            log(
                f"  {method_name} {ratio}× compressed in {seconds:.1f} s, {time.perf_counter() - started:.0f} s with decoding"
            )
            record = {
                "window": window.id,
                "window_tokens": len(rendered.ids),
                "span_tokens": end - start,
                "method": method_name,
                "ratio": ratio,
                "ratio_entries": round((end - start) / spliced.span_entries(start, end), 3),
                "compress_seconds": round(seconds, 2),
                **{layout: _median_record(runs[layout]) for layout in runs},
            }
            _ratios(record)
            records.append(record)
            log(_line(record))
    return records


def _median_record(runs: list[dict]) -> dict:
    peaks = [r["peak_mb"] for r in runs if r["peak_mb"] is not None]
    return {
        "cache_bytes": runs[0]["cache_bytes"],
        "span_bytes": runs[0]["span_bytes"],
        "peak_mb": round(statistics.median(peaks), 2) if peaks else None,
        "decode_ms_per_token": round(statistics.median(r["decode_ms_per_token"] for r in runs), 3),
        "decode_ms_rounds": [round(r["decode_ms_per_token"], 3) for r in runs],
    }


def _ratios(record: dict) -> None:
    full, padded, ragged = (record[layout] for layout in LAYOUTS)
    record["ratio_memory_padded"] = round(full["span_bytes"] / padded["span_bytes"], 3)
    record["ratio_memory_ragged"] = round(full["span_bytes"] / ragged["span_bytes"], 3)
    record["decode_ragged_over_padded"] = round(ragged["decode_ms_per_token"] / padded["decode_ms_per_token"], 3)
    reference = record["transformers"]["decode_ms_per_token"]
    for layout in LAYOUTS:  # what the issue of speed is read from: each layout against plain transformers
        record[f"decode_{layout}_over_transformers"] = round(record[layout]["decode_ms_per_token"] / reference, 3)
    if ragged["peak_mb"] is not None and padded["peak_mb"]:
        record["peak_ragged_over_padded"] = round(ragged["peak_mb"] / padded["peak_mb"], 3)


def _line(r: dict) -> str:
    return (
        f"  {r['method']} {r['ratio']}×: span bytes full/padded/ragged "
        f"{r['full']['span_bytes'] / 2**20:.2f}/{r['padded']['span_bytes'] / 2**20:.2f}/"
        f"{r['ragged']['span_bytes'] / 2**20:.2f} MiB (memory ratio {r['ratio_memory_padded']:.2f}× → "
        f"{r['ratio_memory_ragged']:.2f}×), decode {r['padded']['decode_ms_per_token']:.1f} → "
        f"{r['ragged']['decode_ms_per_token']:.1f} ms/token, peak {r['padded']['peak_mb']} → {r['ragged']['peak_mb']} MB"
    )


def table(records: list[dict]) -> Table:
    t = Table(title="decoding on compressed caches against plain transformers (medians; ratios from the same run)")
    for column in (
        "window",
        "method",
        "ratio",
        "span MiB full / padded / ragged",
        "in memory padded → ragged",
        "cache MiB padded → ragged",
        "peak MB full / padded / ragged",
        "ms/token transformers / full / padded / ragged",
        "÷ transformers: full, padded, ragged",
        "ragged ÷ padded: time, peak",
    ):
        t.add_column(column)
    for r in records:
        f, p, g = (r[layout] for layout in LAYOUTS)
        t.add_row(
            f"{r['span_tokens']} of {r['window_tokens']}",
            r["method"],
            f"{r['ratio']:g}× ({r['ratio_entries']:.2f}×)",
            f"{f['span_bytes'] / 2**20:.2f} / {p['span_bytes'] / 2**20:.2f} / {g['span_bytes'] / 2**20:.2f}",
            f"{r['ratio_memory_padded']:.2f}× → {r['ratio_memory_ragged']:.2f}×",
            f"{p['cache_bytes'] / 2**20:.2f} → {g['cache_bytes'] / 2**20:.2f}",
            f"{_mb(f['peak_mb'])} / {_mb(p['peak_mb'])} / {_mb(g['peak_mb'])}",
            f"{r['transformers']['decode_ms_per_token']:.1f} / {f['decode_ms_per_token']:.1f} / "
            f"{p['decode_ms_per_token']:.1f} / {g['decode_ms_per_token']:.1f}",
            ", ".join(f"{r[f'decode_{layout}_over_transformers']:.2f}" for layout in LAYOUTS),
            f"{r['decode_ragged_over_padded']:.2f}, {r.get('peak_ragged_over_padded', float('nan')):.2f}",
        )
    return t


def _mb(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


@dataclass
class CacheBenchConfig:
    model: BenchModel = nested(BenchModel)
    transcript: str = setting(str(DEFAULT_TRANSCRIPT), "the transcript whose windows are used")
    windows: tuple[int, ...] = setting(
        (512, 2048), "window sizes in tokens (the longest window of each size)", minimum=1
    )
    methods: tuple[str, ...] = setting(("kvzip", "am", "vkv"), "methods compressing each window's span")
    ratios: tuple[float, ...] = setting((3.2, 4.8), "requested ratios", minimum=1, above=True)
    question_tokens: int = setting(32, "tokens of the question prompt after the window", minimum=1)
    new_tokens: int = setting(64, "greedy tokens generated after the question (no early stop)", minimum=1)
    rounds: int = setting(3, "alternating rounds per layout; medians are reported", minimum=1)
    threads: int = setting(1, "torch threads", minimum=1)
    seed: int = setting(0, "seed of the methods", minimum=0)
    json: str = setting("bench-cache.json", "where to write the results")


def run_bench_cache(config: CacheBenchConfig) -> int:
    """Every window size of `config` benchmarked in turn on one loaded model; prints the table, writes the JSON."""
    check_ranges(config)
    console = Console(width=None if sys.stdout.isatty() else 200)
    if not Path(config.transcript).is_file():
        raise VkvError(f"{config.transcript}: no such transcript")
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    started = time.perf_counter()
    lm = config.model.load()
    records: list[dict[str, Any]] = []
    with counted(f"bench cache: {len(config.windows)} window size(s)", len(config.windows)) as done:
        for i, tokens in enumerate(config.windows, 1):
            console.print(f"[bold]window {i}/{len(config.windows)}[/] (~{tokens} tokens)")
            records += bench_window(lm, Path(config.transcript), tokens, config, console.print)
            done()
    console.print(table(records))
    seconds = time.perf_counter() - started
    write_json_atomic(
        config.json,
        {
            "model": config.model.model,
            "device": str(lm.device),
            "seconds": round(seconds, 1),
            "config": asdict(config),
            "records": records,
        },
    )
    console.print(f"benchmark took {seconds:.0f} s; wrote {config.json}")
    return 0
