"""The kvpress half of scripts/crosscheck_kvpress.py: which entries NVIDIA kvpress's presses keep of each window's span.

Runs in .venv-kvpress (kvpress 0.5.5 pins transformers < 5.3, and vkv does not run on that transformers), so it
imports neither vkv nor anything vkv-specific: it reads the windows (token ids, span [start, end)) that the vkv side
wrote, runs each press on the window's ids with kvpress's own scoring and kvpress's own selection rule, and writes,
per window, press and ratio, the span-relative indices every layer and KV head keeps. The vkv side scores them.

The span is compressed, the text before it (the window's system message) kept:
- KVzipPress reconstructs the span only (its `prefix_length`, the part it does not repeat, is set to the span's
  start) and its `compress_post` (one threshold over every layer and KV head, kvpress's code) runs on the span's
  scores only, with no sinks of its own (the kept system message holds the context's first tokens);
- the scorer presses (SnapKV, Knorm) score the whole window, as they would a prompt, and each head keeps its
  `compute_n_kept(span, compression_ratio)` best span entries, kvpress's count and top-k rule;
- StreamingLLMPress's scores are positions relative to the context's start, so it scores the span as its context:
  its sinks are the span's first tokens, as vkv's streaming keeps them.
The presses only choose here: the cache they compress is thrown away.

Usage (normally called by crosscheck_kvpress.py): .venv-kvpress/bin/python scripts/kvpress_side.py IN.json OUT.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version

import torch
import transformers
from kvpress import KnormPress, KVzipPress, SnapKVPress, StreamingLLMPress
from kvpress.utils import compute_n_kept
from transformers import AutoModelForCausalLM, DynamicCache

PRESSES = {"kvzip": KVzipPress, "snapkv": SnapKVPress, "knorm": KnormPress, "streaming": StreamingLLMPress}
SPAN_AS_CONTEXT = ("streaming",)  # presses whose scores are positions: they score the span as their whole context


@dataclass
class SpanKVzipPress(KVzipPress):
    """KVzipPress compressing [span_start, end) of its context: it repeats the span only and splits the span's
    budget with its own global threshold; `kept` `[layers, kv_heads, span]` (bool) and `span_scores` after a run."""

    span_start: int = 0

    def prepare(self, model, tokenizer, *args, **kwargs):
        self.prefix_length = self.span_start  # what KVzip leaves out of the reconstruction
        return super().prepare(model, tokenizer, *args, **kwargs)

    def compress_post(self, model):
        whole, sinks = self.score_val, self.n_sink
        self.score_val, self.n_sink = whole[..., self.span_start :].contiguous(), 0
        try:
            super().compress_post(model)
            self.span_scores = self.score_val[:, 0].float().clone()  # [layers, kv_heads, span]
        finally:
            self.score_val, self.n_sink = whole, sinks
        self.kept = torch.ones(self.span_scores.shape, dtype=torch.bool)
        for layer in model.model.layers:
            _, heads, positions = layer.self_attn.masked_key_indices  # pruned, span-relative
            self.kept[layer.self_attn.layer_idx, heads, positions] = False
            layer.self_attn.masked_key_indices = None  # the next prefill must not see them


def scorer_choice(press, start: int, layers: int) -> list:
    """Make `press` (a ScorerPress) record, per layer, the span entries each KV head keeps, instead of compressing
    the cache: `chosen[layer]` `[kv_heads, kept]` ascending span-relative indices."""
    chosen: list = [None] * layers
    whole = type(press).__name__ != "StreamingLLMPress"

    def compress(module, hidden_states, keys, values, attentions, kwargs):
        if whole:
            scores = press.score(module, hidden_states, keys, values, attentions, kwargs)[..., start:]
        else:
            span = (hidden_states[:, start:], keys[:, :, start:], values[:, :, start:])
            scores = press.score(module, *span, attentions, kwargs)
        n_kept = compute_n_kept(scores.shape[-1], press.compression_ratio)
        chosen[module.layer_idx] = scores[0].topk(n_kept, dim=-1).indices.sort(-1).values
        return keys, values

    press.compress = compress
    return chosen


def run_press(model, name: str, ratio: float, ids: torch.Tensor, start: int) -> dict:
    """One press at vkv ratio `ratio` on one window: kept indices per layer and KV head, seconds (prefill included)."""
    compression_ratio = 1.0 - 1.0 / ratio
    layers = model.config.num_hidden_layers
    started = time.perf_counter()
    if name == "kvzip":
        press = SpanKVzipPress(compression_ratio=compression_ratio, span_start=start)
    else:
        press = PRESSES[name](compression_ratio=compression_ratio)
        chosen = scorer_choice(press, start, layers)
    with torch.no_grad(), press(model):
        model.model(input_ids=ids, past_key_values=DynamicCache(config=model.config))
    seconds = time.perf_counter() - started
    if name == "kvzip":
        kept = [[row.nonzero().flatten().tolist() for row in layer] for layer in press.kept]
    else:
        kept = [c.tolist() for c in chosen]
    out = {"press": name, "ratio": ratio, "compression_ratio": compression_ratio, "seconds": seconds, "kept": kept}
    if name == "kvzip":
        out["span_scores"] = press.span_scores.tolist()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("windows", help="JSON from crosscheck_kvpress.py: model, presses, ratios, windows")
    p.add_argument("out", help="where to write the kept indices (JSON)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # no loading bars or KVzipPress's cost warning on every run
    transformers.logging.disable_progress_bar()
    logging.getLogger("kvpress").setLevel(logging.ERROR)
    job = json.loads(open(args.windows).read())
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    out = {
        "versions": {k: version(k) for k in ("kvpress", "transformers", "torch")},
        "convention": "kvpress compression_ratio = 1 - 1/R for vkv's ratio R",
        "windows": {},
    }
    began = time.perf_counter()
    for w, window in enumerate(job["windows"]):
        ids = torch.tensor([window["ids"]])
        started = time.perf_counter()
        with torch.no_grad():  # the plain prefill, for what a press adds to it
            model.model(input_ids=ids, past_key_values=DynamicCache(config=model.config))
        prefill = time.perf_counter() - started
        runs = [
            run_press(model, name, ratio, ids, window["start"]) for name in job["presses"] for ratio in job["ratios"]
        ]
        out["windows"][window["id"]] = {"prefill_seconds": prefill, "runs": runs}
        print(
            f"[kvpress {time.perf_counter() - began:6.0f}s] window {w + 1}/{len(job['windows'])} {window['id']}: "
            f"{len(runs)} press runs",
            file=sys.stderr,
            flush=True,
        )
    with open(args.out, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
