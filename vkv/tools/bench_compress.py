"""`vkv bench compress`: where each method's compression of one window spends its seconds and memory.

One process, one model, one window: the full-context pass every method is given is run once (the prefill), then
each method compresses the span at one ratio inside `vkv.stages.recording`, so every stage its code names (read-out
pass, on-policy advance, selection, β, values, virtual-token steps, …) is timed, with the end-to-end seconds as
`total` and the peak memory it adds on the host (resident set) and on the device (CUDA allocator). Each method starts
from its own copy of the shared work, so nothing one method computed is reused by the next and each one's stages are
complete.

`--shape` builds a shipped architecture (`vkv.lm.shapes`) with random weights instead of loading `--model`, whose
tokenizer then only writes the context: a synthetic conversation of random tokens, or `--transcript` when one is
given. Times and memory on such a model are those of the real one at the same layers (`--layers` builds only the
first ones: per-layer stages then scale about linearly with the layers); what it computes is noise, so no quality
is ever read from it, and the output says so.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoTokenizer

from vkv.errors import VkvError
from vkv.io import write_json_atomic
from vkv.lm.frozen import FrozenLM
from vkv.lm.load import resolve_model_path
from vkv.lm.shapes import SHAPE_QUANTS, SHAPES, build_random
from vkv.methods import METHODS, get_method
from vkv.progress import counted, status
from vkv.settings import check_ranges, nested, setting
from vkv.stages import recording, stage
from vkv.text.transcript import Message, Transcript, load_transcript, render
from vkv.tools.bench_model import BenchModel
from vkv.tools.bench_scaling import DEFAULT_TRANSCRIPT, mb_text, round_mb, window_work
from vkv.tools.measure import peak_memory

RANDOM_WEIGHTS = "random weights: times and memory only, no quality"


@dataclass
class CompressBenchConfig:
    model: BenchModel = nested(BenchModel)
    shape: str | None = setting(
        None,
        "build this architecture with random weights instead of loading --model (whose tokenizer writes the context)",
        choices=tuple(SHAPES),
    )
    layers: int | None = setting(None, "with --shape: build only its first N layers (default: all)", minimum=1)
    transcript: str | None = setting(
        None, f"the window's transcript (default: {DEFAULT_TRANSCRIPT.name}; with --shape, a synthetic conversation)"
    )
    tokens: int = setting(
        4096, "window length in tokens: the span is everything in it after the system message", minimum=64
    )
    methods: tuple[str, ...] = setting(("kvzip", "am", "vkv", "kvopt"), "methods to time")
    ratio: float = setting(8.0, "the ratio every method compresses at", minimum=1, above=True)
    threads: int | None = setting(None, "torch threads (default: torch's)", minimum=1)
    seed: int = setting(0, "seed of the random weights, the synthetic context and the methods", minimum=0)
    json: str = setting("bench-compress.json", "where to write the results")

    def validate(self) -> CompressBenchConfig:
        check_ranges(self)
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise VkvError(f"field methods: unknown method '{unknown[0]}'; choose from {', '.join(METHODS)}")
        if self.layers is not None and self.shape is None:
            raise VkvError("field layers: only a random-weight model is built by layers; pass --shape too")
        if self.shape is not None and self.model.quant not in SHAPE_QUANTS:
            raise VkvError(
                f"field quant: '{self.model.quant}' is not built for random-weight shapes; "
                f"choose from {', '.join(SHAPE_QUANTS)}"
            )
        if self.transcript is not None and not Path(self.transcript).is_file():
            raise VkvError(f"field transcript: no such transcript {self.transcript}")
        return self


def synthetic_transcript(tokenizer, tokens: int, seed: int) -> Transcript:
    """A conversation the length of an agent session, of random tokens: a system message, then user and assistant
    messages in turn (assistant ones longer, as tool-using replies are), until its text holds more than `tokens`
    tokens. Content is random because a random-weight model attends no differently to sense; the chat template's
    structure is real, since methods place cuts and prompts by it."""
    rng = np.random.default_rng(seed)
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    vocab = np.array(sorted(set(tokenizer.get_vocab().values()) - special))

    def text(n: int) -> str:
        return tokenizer.decode(rng.choice(vocab, size=n).tolist())

    messages = [Message("system", text(min(256, tokens // 8)))]
    length = 0
    while (
        length <= tokens
    ):  # decoding and encoding again can merge tokens: add messages until the rendering is long enough
        sampled = length
        while sampled <= tokens:
            role = "user" if messages[-1].role != "user" else "assistant"
            n = int(rng.integers(32, 256) if role == "user" else rng.integers(128, 1024))
            messages.append(Message(role, text(n)))
            sampled += n
        transcript = Transcript(f"synthetic-{tokens}-seed{seed}", tuple(messages), ())
        length = len(render(transcript, tokenizer).ids)
    return transcript


def load_bench_model(config: CompressBenchConfig) -> FrozenLM:
    """`--model` as it is, or with `--shape` that architecture with random weights and `--model`'s tokenizer."""
    if config.shape is None:
        return config.model.load()
    path, local = resolve_model_path(config.model.model)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
    return build_random(config.shape, tokenizer, config.model.quant, config.model.device, config.layers, config.seed)


def measure(lm: FrozenLM, config: CompressBenchConfig, log) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The window's prefill, then each method of `config` on it: (the window, one record per method)."""
    if config.transcript is None and config.shape is not None:
        transcript = synthetic_transcript(lm.tokenizer, config.tokens, config.seed)
    else:
        transcript = load_transcript(config.transcript or DEFAULT_TRANSCRIPT)
    lm.check_positions(config.tokens, f"field tokens: a window of {config.tokens} tokens", "choose fewer --tokens")
    rendered = render(transcript, lm.tokenizer)
    torch.manual_seed(config.seed)
    with status(f"prefill of {config.tokens} tokens"), peak_memory(lm.device) as peak, recording() as seconds:
        with stage("prefill", lm.device):
            work = window_work(lm, transcript, rendered, config.tokens, config.seed, "tokens")
    window = {
        "transcript": transcript.path or transcript.id,
        "window_tokens": work.end,
        "span_tokens": work.end - work.start,
    }
    records = [
        {"method": "prefill", "stages": _rounded(seconds), "total": round(seconds["prefill"], 3), **_peaks(peak)}
    ]
    span = work.end - work.start
    log(f"{window['transcript']}: first {work.end} tokens, span {span}; prefill {seconds['prefill']:.1f} s")
    with counted(f"bench compress: {len(config.methods)} method(s)", len(config.methods)) as done:
        for name in config.methods:
            records.append(_compress(name, dataclasses.replace(work), config, log))
            done()
    return window, records


def _compress(name: str, work, config: CompressBenchConfig, log) -> dict[str, Any]:
    """One method on its own copy of the work (`dataclasses.replace` starts it with nothing reused)."""
    torch.manual_seed(config.seed)
    started = time.perf_counter()
    try:
        with peak_memory(work.lm.device) as peak, recording() as seconds:
            with stage("total", work.lm.device):
                get_method(name).compress(work, config.ratio)
    except VkvError as exc:  # refused on this window (e.g. past the model's positions): the others go on
        return _failed(name, str(exc), False, started, log)
    except torch.cuda.OutOfMemoryError:  # a measurement too: this method does not fit this device at this length
        torch.cuda.empty_cache()
        return _failed(name, f"out of memory on {work.lm.device}", False, started, log)
    except Exception as exc:  # a bug in one method: its traceback on stderr, and the others still measured
        traceback.print_exc()
        return _failed(name, f"{type(exc).__name__}: {exc}", True, started, log)
    total = seconds.pop("total")
    record = {"method": name, "stages": _rounded(seconds), "total": round(total, 3), **_peaks(peak)}
    device = "" if record["peak_device_mb"] is None else f", +{mb_text(record['peak_device_mb'])} MB device"
    recorded = ", ".join(f"{k} {v:.2f}" for k, v in seconds.items()) or "none recorded"
    log(f"  {name}: {total:.1f} s, peak +{mb_text(record['peak_host_mb'])} MB host{device}; stages {recorded}")
    return record


def _failed(name: str, error: str, crashed: bool, started: float, log) -> dict[str, Any]:
    seconds = time.perf_counter() - started
    log(f"  {name}: {'crashed' if crashed else 'failed'} after {seconds:.1f} s: {error}")
    return {"method": name, "error": error, "crashed": crashed, "seconds": round(seconds, 3)}


def table(records: list[dict], title: str) -> Table:
    """Methods down, stages across (in the order they first ran), then the total and the peaks."""
    stages = list(dict.fromkeys(s for r in records for s in r.get("stages", {})))
    t = Table(title=title)
    t.add_column("method")
    for name in [*stages, "total"]:
        t.add_column(f"{name} s", justify="right")
    t.add_column("peak host MB", justify="right")
    t.add_column("peak device MB", justify="right")
    for r in records:
        if "error" in r:
            t.add_row(r["method"], *["—"] * len(stages), "crashed" if r["crashed"] else "failed", "—", "—")
            continue
        cells = [f"{r['stages'][s]:.2f}" if s in r["stages"] else "—" for s in stages]
        t.add_row(r["method"], *cells, f"{r['total']:.2f}", mb_text(r["peak_host_mb"]), mb_text(r["peak_device_mb"]))
    return t


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({torch.get_num_threads()} threads)"
    except OSError:
        pass
    return f"cpu ({torch.get_num_threads()} threads)"


def run_bench_compress(config: CompressBenchConfig) -> int:
    """Builds or loads the model, measures the window, prints the table and writes the JSON record; 1 when a method
    crashed (the others are measured all the same)."""
    config.validate()
    console = Console(width=None if sys.stdout.isatty() else 200)
    if config.threads:
        torch.set_num_threads(config.threads)
    started = time.perf_counter()
    what = f"shape {config.shape} (random weights)" if config.shape else config.model.model
    with status(f"building {what}" if config.shape else f"loading {what}"):
        lm = load_bench_model(config)
    layers = lm.config.num_hidden_layers
    full_layers = SHAPES[config.shape].settings["num_hidden_layers"] if config.shape else layers
    console.print(
        f"{what}: {layers} of {full_layers} layers, {lm.quant}, {lm.dtype}, on {lm.device} ({device_name(lm.device)}); "
        f"built in {lm.load_seconds:.1f} s"
    )
    if config.shape:
        console.print(f"[bold]{RANDOM_WEIGHTS}[/]")
        if layers < full_layers:
            console.print(
                f"only {layers} of {full_layers} layers built: per-layer stages scale about linearly with layers"
            )
    window, records = measure(lm, config, console.print)
    title = (
        f"seconds per stage, {window['span_tokens']}-token span of a {window['window_tokens']}-token window, "
        f"{config.ratio}x"
    )
    console.print(table(records, title + (f"; {RANDOM_WEIGHTS}" if config.shape else "")))
    seconds = time.perf_counter() - started
    report = {
        "note": RANDOM_WEIGHTS if config.shape else "trained weights",
        "model": config.model.model if config.shape is None else None,
        "shape": config.shape,
        "tokenizer": config.model.model,
        "layers_built": layers,
        "layers_full": full_layers,
        "quant": lm.quant,
        "dtype": str(lm.dtype).removeprefix("torch."),
        "device": str(lm.device),
        "device_name": device_name(lm.device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "tokens": config.tokens,
        "seed": config.seed,
        "ratio": config.ratio,
        "build_seconds": round(lm.load_seconds, 3),
        "seconds": round(seconds, 1),
        **window,
        "config": asdict(config),
        "model_config": lm.config.to_dict(),
        "records": records,
    }
    write_json_atomic(config.json, report)
    console.print(f"benchmark took {seconds:.0f} s; wrote {config.json}")
    crashed = [r["method"] for r in records if r.get("crashed")]
    if crashed:
        console.print(f"[red]{', '.join(crashed)} crashed (tracebacks on stderr): no times for them[/]")
    return 1 if crashed else 0


def _peaks(peak: dict) -> dict[str, float | None]:
    return {"peak_host_mb": round_mb(peak["host_mb"]), "peak_device_mb": round_mb(peak["device_mb"])}


def _rounded(seconds: dict[str, float]) -> dict[str, float]:
    return {name: round(s, 3) for name, s in seconds.items()}
