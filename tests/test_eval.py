"""Every method through the same harness (tiny model), ratio accounting, and question-agnosticism."""

import dataclasses
import json

import pytest
import torch

from tests.conftest import bundled_transcripts
from vkv.cli import main
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.recipe import VkvRecipe
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.evals.validate import check_static
from vkv.methods import METHODS, get_method
from vkv.methods.base import TextMethod
from vkv.text.transcript import load_transcript, parse_transcript, render
from vkv.text.windows import select_windows, turn_windows, window_transcript

FAST = CompressConfig(optim=OptimConfig(steps=2))


@pytest.fixture(scope="module")
def evaluation(tiny_llama, mini_transcript_path_module):
    return TranscriptEval(
        tiny_llama, load_transcript(mini_transcript_path_module), settings=EvalSettings(max_new_tokens=3)
    )


@pytest.fixture(scope="module")
def mini_transcript_path_module():
    from tests.conftest import FIXTURES

    return FIXTURES / "mini-agent.json"


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("ratio", [2.0, 3.2])
def test_every_method_keeps_the_budget_it_claims(evaluation, name, ratio, tiny_lamr_checkpoint):
    recipe = VkvRecipe(FAST) if METHODS[name].recipe_class is VkvRecipe else FAST
    method = get_method(name, recipe=recipe, checkpoint=tiny_lamr_checkpoint)
    result = evaluation.evaluate(method, ratio)
    span = evaluation.end - evaluation.start
    assert result["span_tokens"] == span
    layers, heads, dim = evaluation.lm.cache_shape
    row = 2 * dim * 4  # a K and a V row in fp32
    assert result["span_full_bytes"] == span * layers * heads * row
    if isinstance(method, TextMethod):  # measured on the re-rendered text: role markers are never pruned
        assert 0 < result["compressed_entries"] < span and result["ratio_achieved"] > 1.0
        assert result["ratio_memory"] == pytest.approx(result["ratio_achieved"], rel=1e-3)
        return
    # in memory the decoding cache holds the entries heads reach: their K/V rows, a float32 bias each when they
    # carry one, and per-head offsets when heads differ; so the memory ratio is the entries ratio up to those
    kv_bytes = result["compressed_entries"] * layers * heads * row
    assert kv_bytes <= result["span_memory_bytes"] <= kv_bytes * (row + 4) / row + layers * (heads + 1) * 8
    expected = {"full": span, "none": 0}.get(name, round(span / ratio))
    if name == "reuse":  # the history at its own ratio, the carried last message at the run's
        split = result["optimisation"]["split"]
        expected = round((split - evaluation.start) / method.history_ratio) + round((evaluation.end - split) / ratio)
    assert result["compressed_entries"] == expected
    if expected:
        assert result["ratio_achieved"] == pytest.approx(span / expected, abs=1e-3)
    assert len(result["questions"]) == 2
    for q in result["questions"]:
        assert set(q) >= {"id", "answer", "keyword_correct", "choice_correct", "answer_logprob", "retention"}


def test_references_score_one_and_zero(evaluation):
    full = evaluation.evaluate(get_method("full"), None)
    none = evaluation.evaluate(get_method("none"), None)
    for q in full["questions"]:
        assert q["fidelity_kl"] == pytest.approx(0.0, abs=1e-6)
        assert q["retention"] is None or q["retention"] == pytest.approx(1.0)
    for q in none["questions"]:
        assert q["retention"] is None or q["retention"] == pytest.approx(0.0)


def test_evicted_entries_sit_at_original_positions(evaluation):
    for name in ("truncate", "streaming", "snapkv", "knorm"):  # the same tokens in every head: one position each
        segment = get_method(name, head_budget="shared").compress(evaluation.work, 4.0)
        positions = segment.positions.long()
        assert positions.unique().numel() == positions.numel()
        assert evaluation.start <= positions.min() and positions.max() < evaluation.end
        k_full = evaluation.work.kv.keys[2][0, :, positions]
        torch.testing.assert_close(segment.keys[2], k_full.float())


def test_compression_never_receives_the_questions(evaluation, monkeypatch):
    seen = []
    for cls in METHODS.values():
        monkeypatch.setattr(cls, "compress", _recording(cls.compress, seen))
    for name in ("truncate", "snapkv", "vkv"):
        evaluation.evaluate(get_method(name, recipe=FAST), 3.0)
    assert len(seen) == 3
    for work in seen:
        text = evaluation.lm.tokenizer.decode(work.ids)
        assert work.attention is None
        assert len(work.ids) == len(evaluation.rendered.ids)  # the conversation only, nothing appended
        for q in evaluation.transcript.questions:
            assert q.question not in text


@dataclasses.dataclass
class _KeepEvenLines(TextMethod):
    """A text method that records the query it is given and keeps every other line of each message."""

    name = "even-lines"
    queries: list = dataclasses.field(default_factory=list)

    def prune(self, work, ratio):
        self.queries.append(work.query)
        return ["\n".join(m.content.splitlines()[::2]) for m in work.messages]


def test_text_methods_get_the_latest_request_unless_query_aware(evaluation):
    agnostic = _KeepEvenLines()
    result = evaluation.evaluate(agnostic, 2.0)
    assert agnostic.queries == [evaluation.latest_request()] and not result["question_aware"]
    for q in evaluation.transcript.questions:
        assert q.question not in agnostic.queries[0]
    [report] = result["text_report"]
    multi_line = [m for m in report["messages"] if m["lines"] > 1]
    assert multi_line and all(m["lines_kept"] == (m["lines"] + 1) // 2 for m in report["messages"])
    first = multi_line[0]
    original = evaluation.transcript.messages[first["message"]].content.splitlines()
    assert first["dropped"] == original[1::2]

    aware = _KeepEvenLines(query_aware=True)
    result = evaluation.evaluate(aware, 2.0)
    assert aware.queries == [q.question for q in evaluation.transcript.questions]
    assert result["question_aware"] and len(result["questions"]) == len(aware.queries)
    from vkv.evals.summary import aggregate

    assert aggregate([result])[0]["method"] == "even-lines (question-aware)"


def _recording(fn, seen):
    def wrapper(self, work, ratio, *args, **kw):
        seen.append(work)
        return fn(self, work, ratio, *args, **kw)

    return wrapper


def test_windows_partition_questions(smol_tokenizer):
    for path in bundled_transcripts():
        transcript = load_transcript(path)
        rendered = render(transcript, smol_tokenizer)
        windows = turn_windows(transcript, rendered, 1024)
        assert windows[0][0] == 1 and windows[-1][1] == len(transcript.messages)
        assert all(a[1] == b[0] for a, b in zip(windows, windows[1:]))
        asked = [q.id for a, b in windows for q in window_transcript(transcript, a, b).questions]
        assert sorted(asked) == sorted(q.id for q in transcript.questions if q.source_turns)
        for sub in select_windows(transcript, rendered, 1024, 2):
            assert sub.messages[0].role == "system" and sub.questions
            assert all(0 < t < len(sub.messages) for q in sub.questions for t in q.source_turns)


def test_static_validation_finds_leaks():
    data = {
        "id": "t",
        "messages": [{"role": "system", "content": "Use bcryptjs."}, {"role": "user", "content": "hash with bcryptjs"}],
        "questions": [
            {
                "id": "q",
                "question": "Which?",
                "accept": ["bcryptjs"],
                "choices": ["bcrypt", "bcryptjs"],
                "source_turns": [1],
            }
        ],
    }
    found = check_static(parse_transcript(data))
    assert any("leaks into messages[0]" in p for p in found.problems)
    assert any("choices[0] 'bcrypt' is not an accepted answer" in p for p in found.problems)


def test_bundled_transcripts_validate(capsys, smol_tokenizer):
    paths = [str(p) for p in bundled_transcripts()]
    assert len(paths) >= 20
    assert main(["validate", *paths]) == 0
    splits = {"dev": 0, "test": 0}
    for path in bundled_transcripts():
        t = load_transcript(path)
        splits[t.split] += len(t.questions)
        assert len(t.questions) >= 8 and len(render(t, smol_tokenizer).ids) >= 1500, path
        if t.questions[0].kind:  # the new transcripts label every question, with each kind present
            assert {q.kind for q in t.questions} == {"decision", "tool_output", "change"}, path
    assert splits["test"] >= 200 and sum(splits.values()) >= 350


def test_eval_cli_writes_design_json(tmp_path, test_model_dir, mini_transcript_path):
    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                str(mini_transcript_path),
                "--model",
                "smollm2-135m",
                "--method",
                "full,none,truncate,knorm",
                "--ratio",
                "2,4",
                "--max-new-tokens",
                "2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    results = json.loads(out.read_text())
    assert [(r["method"], r["ratio_requested"]) for r in results] == [
        ("full", None),
        ("none", None),
        ("truncate", 2.0),
        ("truncate", 4.0),
        ("knorm", 2.0),
        ("knorm", 4.0),
    ]
    for r in results:
        assert {
            "transcript",
            "method",
            "model",
            "quant",
            "ratio_requested",
            "ratio_achieved",
            "span_tokens",
            "compressed_entries",
            "seconds",
            "config",
            "questions",
            "summary",
        } <= set(r)
        assert set(r["summary"]) >= {"keyword_accuracy", "choice_accuracy", "mean_retention", "fidelity_kl"}


def test_eval_cli_refuses_unknown_method(mini_transcript_path, capsys):
    assert main(["eval", str(mini_transcript_path), "--model", "smollm2-135m", "--method", "gzip"]) == 2
    assert "unknown method 'gzip'" in capsys.readouterr().err


def test_questions_record_their_distance_from_the_span_end(evaluation):
    result = evaluation.evaluate(get_method("none"), None)
    spans = evaluation.rendered.spans
    by_id = {q["id"]: q for q in result["questions"]}
    # mini-agent: 8 messages, span = turns 1..7; hashing is stated in turns 3 and 4 (turns 5-7 follow), runner
    # in turn 6 (turn 7 follows)
    assert by_id["hashing"]["distance_turns"] == 3
    assert by_id["hashing"]["distance_tokens"] == evaluation.end - spans[4].end > 0
    assert by_id["runner"]["distance_turns"] == 1
    assert by_id["runner"]["distance_tokens"] == evaluation.end - spans[6].end
    assert result["split"] == ""  # a fixture, not a file under transcripts/dev or transcripts/test


def test_text_methods_per_turn_prune_each_message_with_the_request_known_then(evaluation):
    per_turn = _KeepEvenLines(per_turn=True)
    evaluation.evaluate(per_turn, 2.0)
    first, last = evaluation.turns
    messages = evaluation.transcript.messages
    expected = []
    for turn in range(first, last):
        users = [m.content for m in messages[: turn + 1] if m.role == "user"]
        expected.append(users[-1] if users else messages[0].content)
    assert per_turn.queries == expected and len(set(expected)) > 1  # one prune per message, the query moves on


@pytest.mark.parametrize("name", ["truncate", "streaming", "knorm", "snapkv", "am", "kvzip", "kvopt"])
def test_budget_methods_per_turn_keep_each_turns_share_from_its_own_view(evaluation, name):
    from vkv.compress.budget import allocate
    from vkv.compress.turn import message_turns

    work = evaluation.work
    group = get_method(name, per_turn=True).compress(work, 2.0)
    turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
    assert [s.span for s in group] == [(t.start, t.end) for t in turns]
    assert [s.real_entries for s in group] == allocate(
        [t.length for t in turns], work.budget(2.0)
    )  # adaptive budgets pad
    assert sum(s.real_entries for s in group) == work.budget(2.0)
    for segment, turn in zip(group, turns):
        positions = segment.positions.long()
        assert turn.start <= positions.min() and positions.max() < turn.end
    # The first turn sits on the exact system prefix, so its kept entries are the full prefill's entries.
    first = group[0]
    if first.kind == "verbatim":  # am, kvzip and kvopt keep each head its own entries (compact segments)
        rows = first.positions.long()
        assert torch.allclose(first.keys, torch.stack([k[0, :, rows] for k in work.kv.keys]).float(), atol=1e-4)
    result = evaluation.evaluate(get_method(name, per_turn=True), 2.0)
    assert result["compressed_entries"] == work.budget(2.0) and result["optimisation"]["per_turn"]


def test_turn_attention_on_an_uncompressed_history_equals_the_full_forward(evaluation):
    from vkv.compress.turn import message_turns
    from vkv.compress.work import TurnWork
    from vkv.kv.segment import verbatim_segment
    from vkv.kv.spliced import SplicedCache
    from vkv.lm.attention import attention_to_span

    work = evaluation.work
    turn = message_turns(work.message_starts, work.message_roles, work.start, work.end)[2]
    history = SplicedCache()
    history.append(verbatim_segment(work.kv.slice(0, turn.start), 0))
    turn_work = TurnWork.on_cache(work, history, turn)
    keys, queries = (turn.start, turn.end - 3), (turn.end - 3, turn.end)
    expected = attention_to_span(work.lm, work.ids[: turn.end], keys, queries)
    assert torch.allclose(turn_work.attention_between(keys, queries), expected, atol=1e-5)


def test_turn_attention_weighs_a_biased_history_as_its_entries_count(evaluation):
    """A history whose entries carry a bias of log 2 reads as one holding each entry twice: attention inside the turn
    (the snapkv window's, per turn) adds the history's bias as the decoding cache does."""
    import math

    from vkv.compress.turn import message_turns
    from vkv.compress.work import TurnWork
    from vkv.kv.segment import verbatim_segment
    from vkv.kv.spliced import SplicedCache

    work = evaluation.work
    turn = message_turns(work.message_starts, work.message_roles, work.start, work.end)[2]
    own = verbatim_segment(work.kv.slice(0, turn.start), 0)
    biased, doubled = SplicedCache(), SplicedCache()
    biased.append(dataclasses.replace(own, bias=torch.full(own.keys.shape[:3], math.log(2))))
    twice = [torch.cat([t, t], dim=2) for t in (own.keys, own.values)]
    doubled.append(
        dataclasses.replace(own, kind="compact", keys=twice[0], values=twice[1], positions=own.positions.repeat(2))
    )
    keys, queries = (turn.start, turn.end - 3), (turn.end - 3, turn.end)
    got = TurnWork.on_cache(work, biased, turn).attention_between(keys, queries)
    expected = TurnWork.on_cache(work, doubled, turn).attention_between(keys, queries)
    assert torch.allclose(got, expected, atol=1e-5)


def test_window_attention_runs_only_the_window_and_equals_the_full_forward(evaluation):
    from vkv.lm.attention import attention_to_span

    work = evaluation.work
    keys, queries = (work.start, work.end - 5), (work.end - 5, work.end)
    expected = attention_to_span(work.lm, work.ids[: work.end], keys, queries)
    assert torch.allclose(work.attention_between(keys, queries), expected, atol=1e-5)


def test_eval_per_turn_refuses_a_method_without_that_mode(mini_transcript_path, capsys):
    assert main(["eval", str(mini_transcript_path), "--model", "smollm2-135m", "--method", "reuse", "--per-turn"]) == 2
    assert "method 'reuse' has no such mode" in capsys.readouterr().err


def test_pooled_rows_give_the_memory_ratio_of_the_pooled_bytes(evaluation):
    from vkv.evals.summary import aggregate

    runs = [evaluation.evaluate(get_method("kvzip"), ratio) for ratio in (2.0, 4.0)]
    for run in runs:
        run["ratio_requested"] = 3.0  # two windows of one row
    row = aggregate(runs, by_transcript=False)[0]
    full = sum(r["span_full_bytes"] for r in runs)
    held = sum(r["span_memory_bytes"] for r in runs)
    assert row["ratio_memory"] == round(full / held, 3) and row["span_memory_kib"] == round(held / 2 / 1024, 1)
    old = [{k: v for k, v in r.items() if k != "span_memory_bytes"} for r in runs]  # runs from before the ragged cache
    assert aggregate(old, by_transcript=False)[0]["ratio_memory"] is None
