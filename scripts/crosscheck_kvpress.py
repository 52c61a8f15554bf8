"""Cross-check vkv's eviction methods against NVIDIA kvpress's presses, both scored by vkv's own eval.

For the windows `vkv eval` scores (same transcripts, `--window`, `--max-windows`; the span is everything after the
window's leading system message, which stays verbatim), kvpress 0.5.5's KVzipPress, SnapKVPress, KnormPress and
StreamingLLMPress choose which entries each layer and KV head keeps of the span (scripts/kvpress_side.py, run in
.venv-kvpress, writes the kept indices per window to a JSON file). This process, in vkv's .venv, turns each choice
into a compact segment of the span's own K/V (`SpanWork.keep_per_head`) and scores it with `TranscriptEval.evaluate`,
the code path `vkv eval` runs for every method, beside vkv's own `kvzip` (both head budgets: `global`, its default,
and `adaptive`), `snapkv`, `knorm` and `streaming` at the same ratios on the same windows. Ratios are vkv's (span
tokens per kept entry): vkv's R× is kvpress's compression_ratio 1 − 1/R.

Printed: mean retention per method and ratio with a 95 % window-bootstrap interval, the paired difference vkv −
kvpress on the same questions, entries kept per head, seconds per window on each side (kvpress's include its own
prefill of the window, reported apart; vkv's do not, as in `vkv eval`), and for KVzip the per-head rank correlation
of the two importance scores, the share of each layer in the kept entries and the overlap of the kept sets.
`--json` writes every row (vkv eval's result records) and the summary.

`--self-check` feeds vkv's own kvzip choice (each head budget, each ratio) through the same replay path and checks
that the segment is bit-identical and the log-probabilities equal those `vkv eval` computes for kvzip (≤ 1e-4 nats).

Run:
    bash scripts/kvpress_env.sh
    .venv/bin/python scripts/crosscheck_kvpress.py transcripts/test/*.json --window 512 --max-windows 1 \\
        --ratio 3.2,8 --json runs/crosscheck-kvpress.json
    .venv/bin/python scripts/crosscheck_kvpress.py transcripts/test/gen-bug-hunt-8.json --window 512 \\
        --max-windows 1 --self-check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from vkv.cli.eval import eval_units
from vkv.compress.head_budget import per_head_index
from vkv.compress.work import SpanWork
from vkv.evals.intervals import paired_difference, window_bootstrap
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.lm.load import load_model, resolve_model_path
from vkv.methods import get_method
from vkv.methods.base import Method
from vkv.sweep.variants import question_values
from vkv.text.transcript import render

ROOT = Path(__file__).resolve().parent.parent
PRESSES = ("kvzip", "snapkv", "knorm", "streaming")  # kvpress's press and vkv's method of the same name
TOLERANCE = 1e-4  # nats: the self-check's bound on a log-probability's difference (results are rounded to 1e-4)
BEGAN = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - BEGAN:6.0f}s] {message}", file=sys.stderr, flush=True)


# ---- kept entries → vkv's scoring ----------------------------------------------------------------------------------


def head_index(kept: list[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """`kept[layer][kv_head]` span-relative indices → (`index`, `real`) `[layers, kv_heads, t]` as vkv's head-wise
    budgets lay them out (compress/head_budget.py): each head's entries first, ascending, then padding slots (which
    `keep_per_head` fills with copies of the head's first entry, masked out of attention)."""
    layers, heads = len(kept), len(kept[0])
    width = max(1, max(len(h) for layer in kept for h in layer))
    index = torch.zeros(layers, heads, width, dtype=torch.long)
    real = torch.zeros(layers, heads, width, dtype=torch.bool)
    for layer, row in enumerate(kept):
        for head, entries in enumerate(row):
            entries = sorted(entries)
            if entries:
                index[layer, head] = torch.tensor(entries + entries[:1] * (width - len(entries)))
                real[layer, head, : len(entries)] = True
    return index, real


def kept_lists(index: torch.Tensor, real: torch.Tensor) -> list[list[list[int]]]:
    """The inverse of `head_index`: each head's real entries."""
    return [[i[r].tolist() for i, r in zip(li, lr)] for li, lr in zip(index, real)]


@dataclass
class KeptEntries(Method):
    """A method whose choice was made elsewhere: `kept[layer][kv_head]`, the span-relative entries each head keeps.
    They become the segment vkv's head-wise scorers build from their own choice (`ScorerMethod.compress_to`)."""

    name: ClassVar[str] = "kept"
    kept: list = field(default_factory=list)
    source: str = ""

    def compress(self, work: SpanWork, ratio: float, on_step=None):
        index, real = head_index(self.kept)
        return work.keep_per_head(index, real=None if bool(real.all()) else real)

    def config(self) -> dict[str, Any]:
        return {"source": self.source}


def vkv_choice(work: SpanWork, method, ratio: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a vkv scorer method keeps at `ratio` (its scores, `index`, `real`), as `ScorerMethod.compress_to` chooses
    it. vkv exposes no call for this; the reconstruction pass is reused from the method's own run on this work."""
    budget = work.budget(ratio)
    scores = method.score(work, budget)
    return (scores, *per_head_index(scores, budget, method.head_budget))


# ---- the kvpress side ----------------------------------------------------------------------------------------------


def run_kvpress(args, windows: list[dict], out: Path) -> subprocess.Popen:
    """Start scripts/kvpress_side.py in kvpress's venv on the windows; it writes the kept indices to `out`."""
    python = Path(args.kvpress_python)
    if not python.exists():
        sys.exit(f"{python} not found: run `bash scripts/kvpress_env.sh` first (or pass --kvpress-python)")
    job = out.with_suffix(".windows.json")
    model = resolve_model_path(args.model)[0]
    job.write_text(json.dumps({"model": model, "presses": args.presses, "ratios": args.ratio, "windows": windows}))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    command = [
        str(python),
        str(ROOT / "scripts" / "kvpress_side.py"),
        str(job),
        str(out),
        "--threads",
        str(args.threads),
    ]
    log(f"kvpress: {len(windows)} windows × {len(args.presses)} presses × {len(args.ratio)} ratios ({python})")
    return subprocess.Popen(command, env=env)


# ---- summary --------------------------------------------------------------------------------------------------------


def summarise(rows: list[dict], presses: list[str], ratios: list[float]) -> list[dict]:
    """One line per method, variant and ratio: retention with its interval, vkv − kvpress paired, entries, seconds."""
    out = []
    for press in presses:
        for ratio in ratios:
            group = [r for r in rows if r["family"] == press and r["ratio_requested"] == ratio]
            variants = list(dict.fromkeys(r["variant"] for r in group))
            reference = question_values([{"result": r} for r in group if r["side"] == "kvpress"], "retention")
            for variant in variants:
                mine = [r for r in group if r["variant"] == variant]
                values = question_values([{"result": r} for r in mine], "retention")
                pooled = window_bootstrap(values)
                paired = paired_difference(values, reference) if mine[0]["side"] == "vkv" and reference else None
                out.append(
                    {
                        "method": press,
                        "ratio": ratio,
                        "variant": variant,
                        "side": mine[0]["side"],
                        "windows": len(mine),
                        "questions": pooled.questions if pooled else 0,
                        "retention": pooled.mean if pooled else None,
                        "retention_interval": [pooled.low, pooled.high] if pooled else None,
                        "vkv_minus_kvpress": paired.mean if paired else None,
                        "vkv_minus_kvpress_interval": [paired.low, paired.high] if paired else None,
                        "entries_per_head": statistics.mean(r["compressed_entries"] for r in mine),
                        "span_tokens": statistics.mean(r["span_tokens"] for r in mine),
                        "seconds_per_window": statistics.mean(r["seconds"] for r in mine),
                    }
                )
    return out


def print_summary(lines: list[dict], prefill: float | None) -> None:
    header = f"{'method':<10} {'ratio':>5}  {'variant':<16} {'windows':>7} {'qs':>4} {'retention [95% CI]':>25}"
    header += f"  {'vkv − kvpress [95% CI]':>28} {'entries/head':>12} {'s/window':>9}"
    print(header)
    print("-" * len(header))
    for line in lines:
        ci = line["retention_interval"]
        retention = "—" if ci is None else f"{line['retention']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"
        d, dci = line["vkv_minus_kvpress"], line["vkv_minus_kvpress_interval"]
        diff = "" if d is None else f"{d:+.3f} [{dci[0]:+.3f}, {dci[1]:+.3f}]"
        print(
            f"{line['method']:<10} {line['ratio']:>4g}×  {line['variant']:<16} {line['windows']:>7} "
            f"{line['questions']:>4} {retention:>25}  {diff:>28} {line['entries_per_head']:>12.1f} "
            f"{line['seconds_per_window']:>9.2f}"
        )
    if prefill is not None:
        print(f"kvpress seconds include its own prefill of the window ({prefill:.2f} s/window on its own); vkv's don't")


def rank_correlation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Spearman's rho along the last axis (ties broken by order)."""
    ranks = [x.argsort(-1).argsort(-1).double() for x in (a, b)]
    ra, rb = (r - r.mean(-1, keepdim=True) for r in ranks)
    return (ra * rb).sum(-1) / (ra.norm(dim=-1) * rb.norm(dim=-1))


def kvzip_diagnostics(ev: TranscriptEval, run: dict, budgets: list[str]) -> dict:
    """KVzipPress beside vkv's kvzip on one window and ratio: per-head rank correlation of the importance scores,
    entries each layer keeps (summed over its KV heads), and how many of kvpress's entries vkv keeps too."""
    kept_kvpress = torch.zeros(ev.lm.cache_shape[0], ev.lm.cache_shape[1], ev.end - ev.start, dtype=torch.bool)
    for layer, row in enumerate(run["kept"]):
        for head, entries in enumerate(row):
            kept_kvpress[layer, head, entries] = True
    out: dict[str, Any] = {"layer_entries": {"kvpress": kept_kvpress.sum((1, 2)).tolist()}}
    for budget in budgets:
        scores, index, real = vkv_choice(ev.work, get_method("kvzip", head_budget=budget), run["ratio"])
        kept = torch.zeros(index.shape[:2] + kept_kvpress.shape[-1:], dtype=torch.int32)
        kept = kept.scatter_add_(-1, index, real.int()) > 0  # padding repeats a kept entry: add, don't overwrite
        out["layer_entries"][budget] = kept.sum((1, 2)).tolist()
        out.setdefault("overlap", {})[budget] = float((kept & kept_kvpress).sum() / kept_kvpress.sum())
        rho = rank_correlation(scores.double(), torch.tensor(run["span_scores"], dtype=torch.double))
        out["rank_correlation_per_head"] = rho.flatten().tolist()
    return out


def print_diagnostics(diags: dict[float, list[dict]], budgets: list[str]) -> None:
    for ratio, items in diags.items():
        rho = torch.tensor([x for d in items for x in d["rank_correlation_per_head"]])
        q = rho.quantile(torch.tensor([0.1, 0.5, 0.9], dtype=rho.dtype)).tolist()
        print(f"\nKVzip at {ratio:g}× ({len(items)} windows): per-head Spearman rho, vkv's vs kvpress's importance:")
        print(f"  10th / median / 90th percentile {q[0]:.3f} / {q[1]:.3f} / {q[2]:.3f} over {len(rho)} heads")
        overlaps = ", ".join(f"vkv {b} {statistics.mean(d['overlap'][b] for d in items):.3f}" for b in budgets)
        print(f"  share of kvpress's kept entries that vkv keeps too: {overlaps}")
        print("  entries kept per layer (all its KV heads, mean over windows), layer 0 first:")
        for who in ["kvpress", *budgets]:
            per_layer = torch.tensor([d["layer_entries"][who] for d in items], dtype=torch.float).mean(0)
            print(f"  {who:>9}: " + " ".join(f"{x:.0f}" for x in per_layer.tolist()))


# ---- the runs -------------------------------------------------------------------------------------------------------


def tag(result: dict, family: str, variant: str, side: str, **extra) -> dict:
    return {**result, "family": family, "variant": variant, "side": side, **extra}


def self_check(evals: list[TranscriptEval], args) -> int:
    """vkv's own kvzip choice, written out as kept indices and replayed, must score as vkv eval scores kvzip."""
    failures = 0
    print(f"{'window':<40} {'budget':<9} {'ratio':>5}  {'segment':<10} {'max |Δ log p|':>13}  verdict")
    for ev in evals:
        for budget in args.kvzip_head_budget:
            for ratio in args.ratio:
                method = get_method("kvzip", head_budget=budget)
                direct = ev.evaluate(method, ratio)
                _, index, real = vkv_choice(ev.work, method, ratio)
                kept = json.loads(json.dumps(kept_lists(index, real)))  # as the file carries them
                replay = KeptEntries(kept=kept, source="vkv kvzip")
                a, b = method.compress(ev.work, ratio), replay.compress(ev.work, ratio)
                same = all(
                    (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
                    for x, y in ((a.keys, b.keys), (a.values, b.values), (a.positions, b.positions), (a.bias, b.bias))
                )
                replayed = ev.evaluate(replay, ratio)
                gap = max(
                    abs(x - y)
                    for q, r in zip(direct["questions"], replayed["questions"])
                    for x, y in zip(q["choice_logprobs"], r["choice_logprobs"])
                )
                ok = same and gap <= TOLERANCE
                failures += not ok
                print(
                    f"{ev.transcript.id:<40} {budget:<9} {ratio:>4g}×  {'identical' if same else 'DIFFERS':<10} "
                    f"{gap:>13.2e}  {'ok' if ok else 'FAIL'}"
                )
    print(f"self-check: {'passed' if not failures else f'{failures} FAILED'} (tolerance {TOLERANCE:g} nats)")
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("transcripts", nargs="+", help="transcript JSON files, as for vkv eval")
    p.add_argument("--model", default="smollm2-135m", help="vkv model alias or directory (default: smollm2-135m)")
    p.add_argument("--window", type=int, help="as vkv eval: turn windows of at most this many tokens")
    p.add_argument("--max-windows", type=int, help="as vkv eval: the windows with the most questions")
    p.add_argument("--ratio", default="3.2,8", help="vkv ratios R (kvpress compression_ratio 1 − 1/R); default 3.2,8")
    p.add_argument("--presses", default=",".join(PRESSES), help=f"subset of {','.join(PRESSES)}")
    p.add_argument("--kvzip-head-budget", default="global,adaptive", help="vkv kvzip allocations to show")
    p.add_argument("--kvpress-python", default=str(ROOT / ".venv-kvpress" / "bin" / "python"))
    p.add_argument("--kvpress-out", help="keep the kvpress side's kept indices here (default: a temporary file)")
    p.add_argument("--kvpress-in", help="read kept indices from an earlier --kvpress-out instead of running kvpress")
    p.add_argument("--parallel", action="store_true", help="run the kvpress side while vkv scores (timings overlap)")
    p.add_argument("--self-check", action="store_true", help="only replay vkv's own kvzip choice (no kvpress)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=EvalSettings().max_new_tokens,
        help="as vkv eval: longest greedy answer (keyword accuracy only; retention and log-probabilities do not "
        "depend on it, so 1 is a faster run of the same retention)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads on each side (default 1)")
    p.add_argument("--json", help="write every row and the summary here")
    args = p.parse_args()
    args.ratio = [float(r) for r in args.ratio.split(",")]
    args.presses = [x for x in args.presses.split(",") if x]
    args.kvzip_head_budget = [x for x in args.kvzip_head_budget.split(",") if x]
    unknown = set(args.presses) - set(PRESSES)
    if unknown:
        p.error(f"--presses: unknown {', '.join(sorted(unknown))}; choose from {', '.join(PRESSES)}")
    torch.set_num_threads(args.threads)
    convention = ", ".join(f"{r:g}× = {1 - 1 / r:.4f}" for r in args.ratio)
    print(f"ratio convention: vkv R× = kvpress compression_ratio 1 − 1/R ({convention})")

    settings = EvalSettings(max_new_tokens=args.max_new_tokens)
    lm = load_model(args.model, quant="auto", device="cpu")
    units = [t for t, _ in eval_units(lm, args.transcripts, None, args.window, args.max_windows)]
    windows = []
    for t in units:
        rendered = render(t, lm.tokenizer)
        start, end = rendered.token_span(*t.default_span())
        windows.append({"id": t.id, "ids": list(rendered.ids[:end]), "start": start, "end": end})
    log(
        f"{len(units)} windows from {len(args.transcripts)} transcripts, spans of {[w['end'] - w['start'] for w in windows]} tokens"
    )

    if args.self_check:
        evals = []
        for i, t in enumerate(units):
            log(f"window {i + 1}/{len(units)} {t.id}: references")
            evals.append(TranscriptEval(lm, t, settings=settings))
        return self_check(evals, args)

    process, kept_path = None, Path(args.kvpress_in) if args.kvpress_in else None
    if kept_path is None:
        kept_path = Path(args.kvpress_out or Path(tempfile.mkdtemp(prefix="crosscheck-")) / "kept.json")
        process = run_kvpress(args, windows, kept_path)
        if not args.parallel and process.wait() != 0:
            sys.exit(f"the kvpress side failed (exit {process.returncode})")

    rows, evals = [], []
    for i, t in enumerate(units):
        log(f"window {i + 1}/{len(units)} {t.id}: references (full, none)")
        ev = TranscriptEval(lm, t, settings=settings)
        evals.append(ev)
        for press in args.presses:
            for ratio in args.ratio:
                budgets = args.kvzip_head_budget if press == "kvzip" else [None]
                for budget in budgets:
                    method = get_method(press, **({"head_budget": budget} if budget else {}))
                    result = ev.evaluate(method, ratio)
                    variant = f"vkv {budget}" if budget else "vkv"
                    rows.append(tag(result, press, variant, "vkv"))
                    retention = result["summary"]["mean_retention"]
                    retention = "—" if retention is None else f"{retention:.3f}"
                    log(f"  {press} ({variant}) {ratio:g}×: retention {retention}, {result['seconds']:.1f} s")

    if process is not None and process.wait() != 0:
        sys.exit(f"the kvpress side failed (exit {process.returncode})")
    kvpress = json.loads(kept_path.read_text())
    log(f"kvpress {kvpress['versions']}: kept indices from {kept_path}")
    diags: dict[float, list[dict]] = {}
    for i, ev in enumerate(evals):
        window = kvpress["windows"][ev.transcript.id]
        for run in window["runs"]:
            if run["press"] not in args.presses or run["ratio"] not in args.ratio:
                continue
            result = ev.evaluate(KeptEntries(kept=run["kept"], source=f"kvpress {run['press']}"), run["ratio"])
            result = {**result, "method": f"kvpress:{run['press']}", "seconds": round(run["seconds"], 3)}
            extra = {"compression_ratio": run["compression_ratio"], "prefill_seconds": window["prefill_seconds"]}
            rows.append(tag(result, run["press"], "kvpress", "kvpress", **extra))
            if run["press"] == "kvzip":
                diags.setdefault(run["ratio"], []).append(kvzip_diagnostics(ev, run, args.kvzip_head_budget))
        log(f"window {i + 1}/{len(evals)} {ev.transcript.id}: kvpress choices scored")

    order = {"kvpress": 0, **{f"vkv {b}": 1 + j for j, b in enumerate(args.kvzip_head_budget)}, "vkv": 1}
    rows.sort(key=lambda r: (args.presses.index(r["family"]), r["ratio_requested"], order[r["variant"]]))
    lines = summarise(rows, args.presses, args.ratio)
    prefill = statistics.mean(w["prefill_seconds"] for w in kvpress["windows"].values()) if kvpress else None
    print(f"\n{len(evals)} windows; retention pooled over usable questions, intervals by resampling windows\n")
    print_summary(lines, prefill)
    if diags:
        print_diagnostics(diags, args.kvzip_head_budget)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "convention": "vkv ratio R = kvpress compression_ratio 1 - 1/R",
            "kvpress_versions": kvpress["versions"],
            "args": {k: v for k, v in vars(args).items()},
            "summary": lines,
            "kvzip_diagnostics": {str(r): d for r, d in diags.items()},
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(payload, indent=1))
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
