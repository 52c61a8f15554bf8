"""A sweep run's question scoring, one sequence at a time against side by side, on the same compressed context.

    python scripts/bench_scoring.py [TRANSCRIPT] [--window 2048] [--method kvzip] [--ratio 8] [--rounds 3]
                                    [--batch N] [--max-new-tokens N]

The window is `vkv eval --window W --max-windows 1`'s (the one with the most questions; 0: the whole transcript), the
model the test model in fp32 on one CPU thread. The window's span is compressed once; then `TranscriptEval.measure`
scores every question on it, `alone` (`Context.score_alone`: the prompt, each choice, each greedy token in its own
forward) and batched (`Context.score`), in alternating rounds so that a machine whose load drifts slows both alike.
Prints each round's seconds, the medians and their ratio, and how far the two agree: the largest difference of a
choice's log-probability and of a question's fidelity KL, and the greedy answers that differ.
"""

import argparse
import statistics
import time
from pathlib import Path

import torch

from vkv.cli.eval import eval_units
from vkv.evals.metrics import kl_full_to_method
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.lm.load import load_model
from vkv.methods import get_method

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("transcript", nargs="?", default=str(ROOT / "transcripts/long/dev/gen-long-bug-hunt-1.json"))
    parser.add_argument("--window", type=int, default=2048, help="tokens; 0: the whole transcript")
    parser.add_argument("--method", default="kvzip")
    parser.add_argument("--ratio", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=EvalSettings().batch)
    parser.add_argument("--max-new-tokens", type=int, default=EvalSettings().max_new_tokens)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lm = load_model("smollm2-135m", quant="fp32", device="cpu")
    transcript, turns = next(eval_units(lm, [args.transcript], None, args.window or None, 1))
    evaluation = TranscriptEval(
        lm, transcript, turns, EvalSettings(max_new_tokens=args.max_new_tokens, batch=args.batch)
    )
    spliced = evaluation.splice(get_method(args.method).compress(evaluation.work, args.ratio))
    print(
        f"{transcript.id}: span of {evaluation.end - evaluation.start} tokens, {len(evaluation.questions)} questions, "
        f"{args.method} at {args.ratio}x, batch {args.batch}, answers of up to {args.max_new_tokens} tokens"
    )
    seconds: dict[bool, list[float]] = {True: [], False: []}
    measured = {}
    for round_ in range(args.rounds):
        for alone in (True, False):
            started = time.perf_counter()
            measured[alone], _ = evaluation.measure(spliced, alone=alone)
            seconds[alone].append(time.perf_counter() - started)
            print(f"round {round_ + 1}: {'alone' if alone else 'batched'} {seconds[alone][-1]:.1f} s", flush=True)
    before, after = statistics.median(seconds[True]), statistics.median(seconds[False])
    print(
        f"median: alone {before:.1f} s, batched {after:.1f} s: {after / before:.2f} of the time ({before / after:.2f}x)"
    )
    old, new = measured[True], measured[False]
    logp = max(abs(a - b) for o, n in zip(old, new) for a, b in zip(o.choice_logprobs, n.choice_logprobs))
    kl = max(
        abs(kl_full_to_method(f.fidelity_logp, o.fidelity_logp) - kl_full_to_method(f.fidelity_logp, n.fidelity_logp))
        for f, o, n in zip(evaluation.full, old, new)
    )
    answers = sum(o.answer != n.answer for o, n in zip(old, new))
    print(f"largest |Δ log p| {logp:.2e} nats, |Δ fidelity KL| {kl:.2e}; answers that differ: {answers}")


if __name__ == "__main__":
    main()
