"""scripts/score_agreement.py: Spearman's rho over method × ratio cells (ties share their mean rank), and the pairing
of each score cell with the benchmark's runs of the same method, config, ratio and sessions."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from score_agreement import agreement, compare, ranks, spearman  # noqa: E402


def test_ranks_put_the_largest_first_and_average_ties():
    assert ranks([3.0, 1.0, 2.0]) == [1, 3, 2]
    assert ranks([1.0, 2.0, 2.0, 3.0]) == [4, 2.5, 2.5, 1]
    assert ranks([5.0, 5.0, 5.0]) == [2, 2, 2]


def test_spearman_matches_known_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # no ties: 1 − 6 Σd² / (n (n² − 1)) = 1 − 6·4 / 120
    assert spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # a tie: Pearson of ranks (5, 4, 3, 2, 1) and (5, 3.5, 3.5, 2, 1) = 9.5 / √(10 · 9.5)
    assert spearman([1, 2, 3, 4, 5], [1, 2, 2, 4, 5]) == pytest.approx(9.5 / (10 * 9.5) ** 0.5)
    assert spearman([1, 2, 3], [7, 7, 7]) is None  # a constant side has no rank order


def test_compare_ranks_kl_lowest_first_and_reports_both_correlations():
    rows = [
        {"retention": 0.9, "kept": 0.8, "kl": 0.1},
        {"retention": 0.5, "kept": 0.9, "kl": 0.3},
        {"retention": 0.1, "kept": 0.2, "kl": 0.5},
    ]
    rho = compare(rows)
    assert [r["rank_retention"] for r in rows] == [1, 2, 3]
    assert [r["rank_kept"] for r in rows] == [2, 1, 3]
    assert [r["rank_kl"] for r in rows] == [1, 2, 3]
    assert rho == {"kept": pytest.approx(0.5), "-kl": pytest.approx(1.0)}


def sweep_line(session: str, config: dict, retentions: list[float]) -> dict:
    """A finished benchmark run as `vkv sweep` records it, with just the fields the pairing reads."""
    questions = [{"id": f"q{i}", "retention": r, "weak": False} for i, r in enumerate(retentions)]
    return {
        "run_id": f"{session}-{json.dumps(config)}",
        "run": {"method": "knorm", "model": "m"},
        "identity": {"ratio": 8.0, "config": config, "quant": "fp32", "eval": {}},
        "result": {"transcript": f"{session}@turns1-9", "ratio_requested": 8.0, "questions": questions},
        "git": {},
        "seed": 0,
        "wall_seconds": 1.0,
        "peak_memory_mb": 1.0,
    }


def test_cells_pair_with_runs_of_the_same_config_and_sessions_only(tmp_path):
    shared, per_head = {"head_budget": "shared"}, {"head_budget": "uniform"}
    lines = [sweep_line("a", shared, [0.2, 0.4]), sweep_line("b", shared, [0.6]), sweep_line("a", per_head, [0.9])]
    lines.append(sweep_line("c", shared, [0.0]))  # a session the score did not run
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = {"method": "knorm", "config": shared, "ratio_requested": 8.0, "seconds": 1.0}
    scores = [{**run, "transcript": s, "summary": {"kept": k, "kl": 0.1}} for s, k in (("a", 0.5), ("b", 0.7))]
    (tmp_path / "score.json").write_text(json.dumps(scores))
    (row,) = agreement([str(tmp_path / "score.json")], str(tmp_path))
    assert (row["retention"], row["questions"], row["kept"]) == (pytest.approx(0.4), 3, pytest.approx(0.6))
    (tmp_path / "other.json").write_text(json.dumps([{**scores[0], "config": {"head_budget": "adaptive"}}]))
    with pytest.raises(SystemExit, match="no run of knorm"):
        agreement([str(tmp_path / "other.json")], str(tmp_path))
