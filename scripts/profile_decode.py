"""Where a decoding step's time goes: cProfile over ten single-token steps on a compressed cache, ragged then padded.

    python scripts/profile_decode.py [--window 2048] [--method kvzip] [--ratio 8] [--steps 10]

The window is `vkv bench cache`'s (the longest turn window of that size in its default transcript); the model is the
test model in fp32 on one CPU thread. Prints ms per step and the twelve functions with the most time of their own."""

import argparse
import cProfile
import pstats
import time
from pathlib import Path

import torch

from vkv.compress.work import SpanWork
from vkv.lm.context import Context
from vkv.lm.load import load_model
from vkv.lm.splice import splice
from vkv.methods import get_method
from vkv.tools.bench_cache import DEFAULT_TRANSCRIPT, pick_window, question_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--method", default="kvzip")
    parser.add_argument("--ratio", type=float, default=8.0)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lm = load_model("smollm2-135m", quant="fp32", device="cpu")
    window, rendered = pick_window(lm, Path(DEFAULT_TRANSCRIPT), args.window)
    start, end = rendered.token_span(*window.default_span())
    work = SpanWork.capture(lm, rendered.ids, start, end, rendered.message_starts, rendered.message_roles)
    spliced = splice(lm, work.kv, start, end, get_method(args.method).compress(work, args.ratio), [])
    for padded in (False, True):
        context = Context(lm, spliced, padded=padded)
        token = int(context.feed(question_ids(lm, 16))[-1].argmax())
        for _ in range(3):  # warm-up
            context.feed([token])
        profile = cProfile.Profile()
        started = time.perf_counter()
        profile.enable()
        for _ in range(args.steps):
            context.feed([token])
        profile.disable()
        print(f"{'padded' if padded else 'ragged'}: {1000 * (time.perf_counter() - started) / args.steps:.1f} ms/step")
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
