"""Compare two sweep output directories question for question: the runs both hold (same window, method and
ratio) must give the same retention, choice and keyword results. Used to confirm a refactor changes no number.

    python scripts/compare_runs.py runs/new runs/old [--tolerance 1e-3]

Exits 1 when a shared run differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vkv.upgrade import grid_point

NOT_OPTIONS = {
    "model",
    "quant",
    "transcript",
    "method",
    "ratio",
    "seed",
    "window",
    "window_turns",
    "span",
    "max_windows",
}


def finished_runs(directory: str) -> dict[tuple, tuple[dict, str]]:
    """(window, method, requested ratio, the grid point's settings) → (result, git revision) for every finished run in
    the directory. The settings are the grid point's as the file gave them (a method's table, e.g. am.per_turn, and
    recipe keys), read in today's spelling (`vkv.upgrade.grid_point`: vkv's earlier mode methods as vkv's options);
    the resolved config is not part of the key, since a refactor may spell it differently."""
    out = {}
    for path in sorted(Path(directory).glob("results*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if isinstance(row.get("result"), dict):
                point = grid_point(row.get("run", {}))
                given = {k: v for k, v in point.items() if k not in NOT_OPTIONS}
                given = {k: v for k, v in given.items() if not (k.endswith(".per_turn") and v is False)}  # default
                options = tuple(sorted((k, str(v)) for k, v in given.items()))
                key = (row["identity"]["unit"], point["method"], row["result"]["ratio_requested"], options)
                out[key] = (row["result"], row.get("git", {}).get("revision", "?")[:7])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("new")
    parser.add_argument("old")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="largest |Δ retention| counted as equal")
    args = parser.parse_args()
    new, old = finished_runs(args.new), finished_runs(args.old)
    shared = sorted(set(new) & set(old), key=str)
    differ = 0
    for key in shared:
        (a, rev_a), (b, rev_b) = new[key], old[key]
        qa, qb = a["questions"], b["questions"]
        same_ids = [q["id"] for q in qa] == [q["id"] for q in qb]
        delta = max((abs((x.get("retention") or 0) - (y.get("retention") or 0)) for x, y in zip(qa, qb)), default=0.0)
        same_answers = all(
            (x.get("choice_correct"), x.get("keyword_correct")) == (y.get("choice_correct"), y.get("keyword_correct"))
            for x, y in zip(qa, qb)
        )
        ok = same_ids and same_answers and delta <= args.tolerance
        differ += not ok
        print(
            f"{'same' if ok else 'DIFF'}  {key[0]} {key[1]} {key[2]} {dict(key[3]) or ''}: "
            f"max |Δ retention| {delta:.2e} ({rev_a} vs {rev_b})"
        )
    print(f"{len(shared) - differ} of {len(shared)} shared runs identical question for question")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
