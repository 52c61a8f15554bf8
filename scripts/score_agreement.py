"""Does `vkv score` rank methods as question-based retention does? For every method × ratio cell of the score JSONs,
the mean held-out `kept` and `kl` over their sessions beside the question-based retention of the benchmark's runs of
the same method (the same recorded config) and ratio on the same sessions, pooled as `vkv report` pools it; then the
Spearman rank correlation over the cells, and the cells whose ranks differ.

    python scripts/score_agreement.py evals/score-agreement/*.json --benchmark evals/benchmark-long > evals/score-agreement/agreement.md

The references (full, none) are left out of the correlation: both sides give them 1 and 0 by definition.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from vkv.evals.intervals import window_bootstrap
from vkv.evals.metrics import mean
from vkv.evals.summary import base_transcript
from vkv.sweep.variants import load, question_values


def ranks(values: list[float]) -> list[float]:
    """Rank 1 for the largest value; tied values share the mean of the ranks they span (as Spearman's rho needs)."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start : end + 1]:
            out[i] = (start + end) / 2 + 1
        start = end + 1
    return out


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rho: Pearson's correlation of the tie-averaged ranks; None where either side is constant."""
    ra, rb = np.array(ranks(a)), np.array(ranks(b))
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def score_cells(paths: list[str]) -> dict[tuple, list[dict]]:
    """The score runs that compress, by (method, config, ratio): one record per session."""
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for path in paths:
        for r in json.loads(Path(path).read_text()):
            if r["ratio_requested"] is not None:
                cells[(r["method"], json.dumps(r["config"], sort_keys=True), r["ratio_requested"])].append(r)
    return cells


def agreement(paths: list[str], benchmark: str) -> list[dict]:
    """One row per cell: the score's mean kept and KL over its sessions and the retention of the benchmark runs of
    the same method, config and ratio on those sessions (refused where a session has no such run)."""
    lines = load(benchmark).lines
    rows = []
    for (method, config, ratio), runs in score_cells(paths).items():
        sessions = {base_transcript(r) for r in runs}
        matched = [
            line
            for line in lines
            if (line["run"]["method"], line["identity"]["ratio"]) == (method, ratio)
            and json.dumps(line["identity"]["config"], sort_keys=True) == config
            and base_transcript(line["result"]) in sessions
        ]
        missing = sessions - {base_transcript(line["result"]) for line in matched}
        if missing:
            raise SystemExit(f"{benchmark}: no run of {method} {config} at {ratio}x on {', '.join(sorted(missing))}")
        retention = window_bootstrap(question_values(matched, "retention"))
        rows.append(
            {
                "method": method,
                "ratio": ratio,
                "sessions": len(sessions),
                "questions": retention.questions,
                "retention": retention.mean,
                "retention_ci": [retention.low, retention.high],
                "kept": mean(r["summary"]["kept"] for r in runs),
                "kl": mean(r["summary"]["kl"] for r in runs),
                "seconds": mean(r["seconds"] for r in runs),  # a run counts the ratio-free work its ratios share
            }
        )
    return sorted(rows, key=lambda row: -row["retention"])


def compare(rows: list[dict]) -> dict[str, float | None]:
    """Rank the cells by retention, by kept and by −KL (rank 1 the best; `rank_retention`, `rank_kept`, `rank_kl` set
    on each row), and give Spearman's rho of retention with kept and with −KL."""
    retention = [r["retention"] for r in rows]
    sides = {"retention": retention, "kept": [r["kept"] for r in rows], "kl": [-r["kl"] for r in rows]}
    for name, values in sides.items():
        for row, rank in zip(rows, ranks(values)):
            row[f"rank_{name}"] = rank
    return {"kept": spearman(retention, sides["kept"]), "-kl": spearman(retention, sides["kl"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scores", nargs="+", help="`vkv score --json` outputs")
    parser.add_argument("--benchmark", default="evals/benchmark-long", help="the sweep folder with the retention runs")
    args = parser.parse_args()
    rows = agreement(args.scores, args.benchmark)
    rho = compare(rows)
    print(
        "| method | ratio | sessions · questions | retention [95 %] (rank) | score kept (rank) | score KL (rank of −KL) | compress s per session |"
    )
    print("|---|---:|---:|---|---|---|---:|")
    for r in rows:
        low, high = r["retention_ci"]
        print(
            f"| {r['method']} | {r['ratio']:g}× | {r['sessions']} · {r['questions']} | {r['retention']:.3f} [{low:.3f}, {high:.3f}] ({r['rank_retention']:g})"
            f" | {r['kept']:.3f} ({r['rank_kept']:g}) | {r['kl']:.4f} ({r['rank_kl']:g}) | {r['seconds']:.0f} |"
        )
    shown = {k: "— (a constant side)" if v is None else f"{v:.3f}" for k, v in rho.items()}
    print(
        f"\n{len(rows)} cells; Spearman(retention, kept) = {shown['kept']}; Spearman(retention, −KL) = {shown['-kl']}"
    )
    for name in ("kept", "kl"):
        differ = sorted(rows, key=lambda r: -abs(r["rank_retention"] - r[f"rank_{name}"]))
        shown = ", ".join(
            f"{r['method']} {r['ratio']:g}× ({r['rank_retention']:g} vs {r[f'rank_{name}']:g})"
            for r in differ
            if r["rank_retention"] != r[f"rank_{name}"]
        )
        print(f"ranks that differ, retention vs {name}, most first: {shown or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
