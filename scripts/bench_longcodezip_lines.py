"""Model tokens and wall time for LongCodeZip's line scoring: one pass per chunk vs one pass per line.

The public implementation scores each line with its own forward pass over the function up to that
line (quadratic); vkv's backend reads every line's NLL off one causal pass per chunk (and, when the
ranking and line models are the same, off the ranking pass itself, at no extra cost). Both methods
are run here on the same chunks and the same token ids, so their numbers must agree.

    python scripts/bench_longcodezip_lines.py [--file F] [--model smollm2-135m]

Defaults to `copy.py` from the running Python's standard library (about 300 lines, function-dense).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=copy.__file__, help="a source file (default: stdlib copy.py)")
    parser.add_argument("--model", default="smollm2-135m", help="model alias, directory or hub id")
    parser.add_argument("--language", default=None, help="override the language detected from the extension")
    parser.add_argument("--min-lines", type=int, default=5, help="chunks shorter than this skip the fine stage")
    args = parser.parse_args()

    from vkv.backends.longcodezip.chunking import ChunkLimits, chunk_document
    from vkv.backends.longcodezip.document import parse_document
    from vkv.backends.longcodezip.languages import detect_language
    from vkv.backends.longcodezip.scoring import Scorer, line_nll_one_pass, line_nll_per_line_passes
    from vkv.backends.longcodezip.settings import LongCodeZipSettings
    from vkv.backends.longcodezip.source import read_source
    from vkv.backends.longcodezip.tokens import tokenize_lines
    from vkv.lm.load import load_model

    lm = load_model(args.model)
    text = read_source(args.file)
    doc = parse_document(text, detect_language(args.file, args.language))
    line_tokens = tokenize_lines(lm.tokenizer, doc.lines).tokens_per_line()
    # The fine stage's chunks: the default class split, no budget-driven splitting.
    chunks = chunk_document(doc, line_tokens, ChunkLimits(LongCodeZipSettings().max_chunk_tokens, 10**9))
    chunks = [c for c in chunks if c.line_count >= args.min_lines]
    tokenized = [tokenize_lines(lm.tokenizer, doc.lines[c.start : c.end]) for c in chunks]

    rows = []
    results = {}
    for label, method in (("one pass per chunk", line_nll_one_pass), ("one pass per line", line_nll_per_line_passes)):
        scorer = Scorer(lm)
        started = time.perf_counter()
        results[label] = [method(scorer, t) for t in tokenized]
        rows.append((label, scorer.meter.tokens, scorer.meter.calls, time.perf_counter() - started))

    single, per_line = results["one pass per chunk"], results["one pass per line"]
    diff = max(float(np.nanmax(np.abs(a - b))) if np.isfinite(a).any() else 0.0 for a, b in zip(single, per_line))
    print(f"file: {args.file} ({len(doc.lines)} lines, {int(line_tokens.sum())} tokens, language {doc.language.name})")
    print(f"model: {lm.name}; {len(chunks)} chunks of ≥ {args.min_lines} lines scored line by line")
    print(f"{'method':<34}{'model tokens':>14}{'forward calls':>15}{'wall s':>10}")
    for label, tokens, calls, seconds in rows:
        print(f"{label:<34}{tokens:>14,}{calls:>15,}{seconds:>10.2f}")
    print(f"{'from the ranking pass (same model)':<34}{0:>14,}{0:>15,}{0.0:>10.2f}")
    (_, one_tokens, _, one_s), (_, per_tokens, _, per_s) = rows
    print(f"per-line / single-pass: {per_tokens / one_tokens:.1f}× tokens, {per_s / one_s:.1f}× wall time")
    print(f"largest difference between the two methods' line NLLs: {diff:.2e} bits")
    return 0 if per_tokens >= 10 * one_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
