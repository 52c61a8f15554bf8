"""Cloze recall: the cloze form derived from a transcript, its scoring, recall kept in the eval's records, and the
report's recall columns, old records without them included."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.conftest import FIXTURES
from tests.report_helpers import line
from vkv.evals.cloze import REQUEST, cloze, cloze_correct, recall_summary
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.evals.summary import aggregate
from vkv.methods import METHODS, get_method
from vkv.sweep.paired import paired
from vkv.sweep.pooled_rows import rows
from vkv.sweep.report import ReportConfig, run_report
from vkv.sweep.variants import load
from vkv.text.transcript import Message, Question, load_transcript

MINI = FIXTURES / "mini-agent.json"


@pytest.fixture(scope="module")
def mini():
    return load_transcript(MINI)


def test_cloze_prefix_is_the_text_before_the_keywords_last_whole_token_occurrence(mini):
    hashing, runner = mini.questions
    # turn 4 opens with bcryptjs (nothing before it) and then has it only inside bcryptjs.hash, no whole token: the
    # last usable occurrence is in turn 3's package.json, its prefix reaching back across lines
    form = cloze(hashing, mini)
    assert form.usable and form.request == REQUEST
    assert form.prefix == (
        '{\n  "name": "taskapi",\n  "dependencies": {\n    "express": "^4.19.2",\n'
        '    "better-sqlite3": "^11.1.2",\n    "'
    )
    # a rejected value later on the line (Jest) does not matter: only the completion's opening is scored
    assert cloze(runner, mini).prefix == "We'll use the built-in"
    # trimmed to whole words within the length, and kept to the keyword's own line when asked
    assert cloze(runner, mini, max_chars=20).prefix == "use the built-in"
    assert cloze(hashing, mini, lines=False).prefix == '"'


def test_cloze_is_skipped_with_a_reason_and_never_gives_the_answer_away(mini):
    hashing = mini.questions[0]
    assert cloze(dataclasses.replace(hashing, source_turns=()), mini).why == "no source turns"
    assert cloze(dataclasses.replace(hashing, source_turns=(1,)), mini).why.startswith("no accepted keyword")
    assert cloze(dataclasses.replace(hashing, source_turns=(4,)), mini).why.startswith("the keyword opens")
    # a prefix never holds the keyword: it starts after an earlier occurrence
    pinned = Message("assistant", "Pin zod 3.2; zod stays at 3.2 from now on.")
    transcript = dataclasses.replace(mini, messages=(*mini.messages[:6], pinned, *mini.messages[7:]))
    pin = Question("pin", "Which zod version?", accept=("3.2",), source_turns=(6,))
    assert cloze(pin, transcript).prefix == "; zod stays at"


def test_cloze_correct_scores_the_completions_opening_only():
    q = Question("q", "?", accept=("node:test",), reject=("jest",))
    assert cloze_correct(" node:test runner, so no Jest dependency", q)
    assert not cloze_correct(" the node:test runner", q)  # the keyword further on is no copy of the line
    assert not cloze_correct(" node:tests", q)  # whole tokens only, as answers are matched
    assert not cloze_correct("", q)


def test_recall_counts_only_the_questions_the_full_context_completes():
    questions = [
        {"recall_counts": True, "cloze_correct": True},
        {"recall_counts": True, "cloze_correct": False},
        {"recall_counts": False, "cloze_correct": True},  # full missed it: says nothing about the method
        {"cloze_prefix": None, "cloze_skipped": "no source turns", "recall_counts": False},
    ]
    assert recall_summary(questions) == {"recall_kept": 0.5, "recall_questions": 2}
    assert recall_summary(questions[2:]) == {"recall_kept": None, "recall_questions": 0}
    assert recall_summary([{"keyword_correct": True}]) == {}  # a record from before clozes: not measured


def test_eval_records_the_cloze_beside_each_question(tiny_llama, mini):
    evaluation = TranscriptEval(tiny_llama, mini, settings=EvalSettings(max_new_tokens=3))
    full = evaluation.evaluate(get_method("full"), None)
    truncated = evaluation.evaluate(get_method("truncate"), 2.0)
    for q_full, q in zip(full["questions"], truncated["questions"]):
        assert q["cloze_prefix"] == cloze(next(x for x in mini.questions if x.id == q["id"]), mini).prefix
        assert isinstance(q["cloze_answer"], str) and isinstance(q["cloze_correct"], bool)
        # a question counts for recall where the full context completes its cloze, in every run alike
        assert q["recall_counts"] == q_full["recall_counts"] == q_full["cloze_correct"]
    for result in (full, truncated):
        assert set(result["summary"]) >= {"recall_kept", "recall_questions"}
    assert full["summary"]["recall_kept"] in (1.0, None)  # the full context completes every cloze that counts
    # side by side or one at a time, the same completions
    alone = TranscriptEval(tiny_llama, mini, settings=EvalSettings(max_new_tokens=3, batch=0))
    assert [m.cloze_answer for m in alone.full] == [m.cloze_answer for m in evaluation.full]
    off = TranscriptEval(tiny_llama, mini, settings=EvalSettings(max_new_tokens=3, cloze=False))
    result = off.evaluate(get_method("full"), None)
    assert "recall_kept" not in result["summary"] and "cloze_prefix" not in result["questions"][0]
    assert aggregate([result])[0]["recall_kept"] is None


def test_compressors_never_see_the_cloze(tiny_llama, mini, monkeypatch):
    evaluation = TranscriptEval(tiny_llama, mini, settings=EvalSettings(max_new_tokens=2))
    seen = []
    for cls in METHODS.values():
        original = cls.compress

        def recording(self, work, *args, _original=original, **kwargs):
            seen.append(work)
            return _original(self, work, *args, **kwargs)

        monkeypatch.setattr(cls, "compress", recording)
    evaluation.evaluate(get_method("snapkv"), 3.0)
    assert seen and all(len(work.ids) == len(evaluation.rendered.ids) for work in seen)
    text = tiny_llama.tokenizer.decode(seen[0].ids)
    assert REQUEST not in text  # the request (and the prefix after it) are appended only when scoring


def test_smol_full_context_completes_a_cloze_it_can_copy(smol, mini):
    """The test model copies the package.json line it saw: bcryptjs after its prefix, with the whole context."""
    evaluation = TranscriptEval(smol, mini, settings=EvalSettings(max_new_tokens=4))
    result = evaluation.evaluate(get_method("full"), None)
    hashing = next(q for q in result["questions"] if q["id"] == "hashing")
    assert hashing["cloze_correct"] and hashing["recall_counts"]
    assert result["summary"]["recall_kept"] == 1.0 and result["summary"]["recall_questions"] >= 1


def _with_recall(record, correct):
    for q, c in zip(record["result"]["questions"], correct):
        q.update(cloze_prefix="p", cloze_answer="a", cloze_correct=c, recall_counts=True)
    return record


def test_report_shows_recall_kept_and_a_dash_for_old_records(tmp_path):
    new = tmp_path / "new"
    new.mkdir()
    lines = [
        _with_recall(line("f", "full", None, [True, True, True]), [True, True, True]),
        _with_recall(line("n", "none", None, [False, False, False]), [False, False, True]),
        _with_recall(line("t", "truncate", 2.0, [True, False, False]), [True, False, False]),
        line("k", "knorm", 2.0, [True, True, False]),  # a run made before clozes
    ]
    (new / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    table = {r["variant"]: r for r in rows(load(new))}
    assert table["truncate"]["recall_kept"] == pytest.approx(1 / 3) and table["truncate"]["recall_questions"] == 3
    assert table["truncate"]["recall_ci"] is not None
    assert table["knorm"]["recall_kept"] is None and table["knorm"]["recall_ci"] is None
    diffs = {r["variant"]: r for r in paired(load(new), "full")}
    assert diffs["truncate"]["recall"].mean == pytest.approx(-2 / 3) and diffs["knorm"]["recall"] is None
    assert run_report(new, ReportConfig(vs="full")) == 0
    report = (new / "report" / "report.md").read_text()
    assert "recall kept" in report and "Δ recall kept" in report
    knorm = next(row for row in report.splitlines() if row.startswith("| knorm |"))
    assert "| — | — | — |" in knorm  # recall kept, its interval and its count: not measured


def test_report_of_only_old_records_still_reports(tmp_path):
    (tmp_path / "results.jsonl").write_text(
        "".join(json.dumps(x) + "\n" for x in [line("f", "full", None, [True]), line("t", "truncate", 2.0, [False])])
    )
    assert run_report(tmp_path, ReportConfig(vs="full")) == 0
    assert "recall kept" in (tmp_path / "report" / "report.md").read_text()
