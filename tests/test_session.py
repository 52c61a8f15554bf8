"""Sequential multi-turn compression and the Session API (tiny random model, two optimiser steps)."""

import json

import pytest
import torch

from tests.conftest import build_tiny
from vkv.api.compress import compress_with
from vkv.api.session import Session
from vkv.cli import build_parser, recipe_from_args
from vkv.compress.budget import allocate, span_budget
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.recipe import VkvRecipe
from vkv.compress.turn import message_turns
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.file import cache_metadata, read_header, save_cache
from vkv.kv.report import report_rows, report_totals
from vkv.kv.segment import SegmentGroup
from vkv.kv.spliced import SplicedCache
from vkv.lm.context import Context
from vkv.lm.splice import reencode
from vkv.methods import get_method
from vkv.text.transcript import load_transcript, render

FAST = CompressConfig(verbatim_share=0.0, optim=OptimConfig(steps=2))  # virtual tokens alone
QUESTION = "Which library hashes the passwords?"


@pytest.fixture(scope="module")
def transcript():
    from tests.conftest import FIXTURES

    return load_transcript(FIXTURES / "mini-agent.json")


@pytest.fixture(scope="module")
def session(tiny_llama, transcript):
    """Messages 0-4 appended, 1-3 compressed online at 2×, then 5-7 appended one at a time."""
    s = Session(tiny_llama, get_method("vkv", recipe=VkvRecipe(FAST, target_source="online")))
    s.extend(list(transcript.messages[:5]))
    s.compress(turns=(1, 4), ratio=4.0)
    for message in transcript.messages[5:]:
        s.append(message)
    return s


def question_logits(lm, session: Session, spliced: SplicedCache) -> torch.Tensor:
    prompt = session.lm.tokenizer(QUESTION, add_special_tokens=False)["input_ids"]
    return Context(lm, spliced).feed(prompt)


def test_running_cache_equals_a_one_shot_splice_of_the_same_segments(tiny_llama, session):
    lm, segments = tiny_llama, session.cache.segments
    assert [s.kind for s in segments] == ["verbatim"] + ["virtual"] * 3 + ["verbatim"] * 4
    assert [tuple(s.span) for s in segments] == [(t.start, t.end) for t in session.turns]
    one_shot = SplicedCache(list(segments[:4]), segments[3].span[1])
    one_shot.append(reencode(lm, one_shot, session.ids[segments[4].span[0] :]))  # messages 4-7 in one pass
    assert one_shot.next_position == session.cache.next_position == len(session.ids)
    torch.testing.assert_close(
        question_logits(lm, session, session.cache), question_logits(lm, session, one_shot), atol=1e-5, rtol=1e-5
    )
    for i, segment in enumerate(segments[1:4], start=1):  # each virtual turn was computed on the turns before it
        _, values = lm.forward_kv(segment.embeddings[None], segment.positions, SplicedCache(segments[:i]).kv())
        torch.testing.assert_close(torch.cat(values), segment.values, atol=1e-5, rtol=1e-5)


def test_session_save_load_round_trips_and_refuses_other_files(tiny_llama, smol_tokenizer, session, tmp_path):
    path = tmp_path / "session.safetensors"
    session.save(path)
    restored = Session.load(path, tiny_llama)
    assert restored.ids == session.ids and restored.messages == session.messages
    assert json.dumps(restored.method.config()) == json.dumps(session.method.config())
    assert torch.equal(
        question_logits(tiny_llama, session, session.cache), question_logits(tiny_llama, restored, restored.cache)
    )
    assert restored.ask(QUESTION, max_new_tokens=4) == session.ask(QUESTION, max_new_tokens=4)
    assert restored.report() == session.report()
    with pytest.raises(VkvError, match="fingerprint"):
        Session.load(path, build_tiny("qwen2", smol_tokenizer))
    plain = tmp_path / "plain.safetensors"
    save_cache(SplicedCache(session.cache.segments, session.cache.next_position, cache_metadata(tiny_llama)), plain)
    with pytest.raises(VkvError, match="not a saved session"):
        Session.load(plain, tiny_llama)


def test_compression_goes_forward_only_and_keeps_memory_compressed(tiny_llama, transcript, session):
    with pytest.raises(VkvError, match="already compressed"):
        session.compress(turns=(2, 5))
    with pytest.raises(VkvError, match="outside"):
        session.compress(turns=(3, 99))
    assert session.slots == session.cache.physical_length < len(session.ids)
    with pytest.raises(VkvError, match="role"):
        Session(tiny_llama).append({"role": "robot", "content": "hi"})


@pytest.fixture(scope="module")
def evaluation(tiny_llama, transcript):
    return TranscriptEval(  # a part of the span: its later turns stay verbatim, and only the compressed cache matters
        tiny_llama, transcript, turns=(1, 6), settings=EvalSettings(max_new_tokens=2), allow_leaks=True
    )


def test_oracle_and_online_record_per_turn_loss_and_drift(evaluation):
    work = evaluation.work
    turns = message_turns(work.message_starts, None, work.start, work.end)
    records = {}
    for mode in ("oracle", "online"):
        group = get_method("vkv", per_turn=True, recipe=VkvRecipe(FAST, target_source=mode)).compress(work, 2.0)
        rows = group.stats["turns"]
        assert group.real_entries == sum(r["entries"] for r in rows) == round(sum(t.length for t in turns) / 2)
        assert [r["targets"] for r in rows] == [mode] * len(turns) and len(rows) == 5
        assert all(r["loss"] > 0 for r in rows)
        assert rows[0]["drift"] == pytest.approx(0.0, abs=1e-6)  # the first turn sits on the exact prefix
        assert all(r["drift"] > 0 for r in rows[1:])  # later turns sit on compressed history
        records[mode] = rows
    assert [r["loss"] for r in records["oracle"]] != [r["loss"] for r in records["online"]]


def test_budget_is_shared_exactly_over_turns():
    counts = allocate([26, 19, 46, 67, 1, 3], 51)
    assert sum(counts) == 51 and all(1 <= c <= n for c, n in zip(counts, [26, 19, 46, 67, 1, 3]))
    assert allocate([10, 10], 20) == [10, 10]
    with pytest.raises(VkvError, match="cannot give each of its 4 turns one"):
        allocate([2, 2, 2, 2], 1)
    with pytest.raises(VkvError, match="exceeds the 4 tokens"):
        allocate([2, 2], 5)


def test_sequential_method_splices_one_segment_per_message(evaluation):
    result = evaluation.evaluate(get_method("vkv", per_turn=True, recipe=VkvRecipe(FAST)), 3.0)
    span = evaluation.end - evaluation.start
    rows = result["optimisation"]["turns"]
    assert result["compressed_entries"] == round(span / 3.0) == sum(r["entries"] for r in rows)
    assert len(result["optimisation"]["turns"]) == 5 and len(result["questions"]) == 2
    first, last = evaluation.turns
    assert [r["role"] for r in rows] == [m.role for m in evaluation.transcript.messages[first:last]]
    group = get_method("vkv", per_turn=True, recipe=VkvRecipe(FAST)).compress(evaluation.work, 3.0)
    assert isinstance(group, SegmentGroup) and len(group) == 5
    assert evaluation.splice(group).span_entries(evaluation.start, evaluation.end) == group.real_entries


def test_sequential_with_head_wise_shares_keeps_each_turns_budget_and_measures_its_loss(evaluation):
    """Each message optimises twice its budget's virtual tokens, each head reaching its share: the entries heads
    reach still add up to the span's budget, and each turn's V loss is measured against its own (larger) targets.
    Online targets stay online: the shares are chosen with the queries the running cache gives (once, the problem
    fetched them from the full history, and online runs matched oracle ones loss for loss)."""
    recipe = CompressConfig(head_budget="adaptive", optim=OptimConfig(steps=2))
    losses = {}
    for mode in ("oracle", "online"):
        result = evaluation.evaluate(
            get_method("vkv", per_turn=True, recipe=VkvRecipe(recipe, target_source=mode)), 3.0
        )
        span = evaluation.end - evaluation.start
        assert result["compressed_entries"] == pytest.approx(round(span / 3.0))
        assert result["stored_entries"] > result["compressed_entries"]
        losses[mode] = [r["loss"] for r in result["optimisation"]["turns"]]
        assert all(loss is not None and loss > 0 for loss in losses[mode])
    assert losses["oracle"][1:] != pytest.approx(losses["online"][1:], rel=1e-3)


def test_cli_glue_builds_a_reportable_multiturn_cache(tiny_llama, transcript, tmp_path):
    flags = ["--target-source", "oracle", "--verbatim", "shared", "--verbatim-keep-by", "surprisal", "--steps", "2"]
    plan = recipe_from_args(build_parser().parse_args(["compress", "t.json", "--out", "c.safetensors", *flags]))
    assert plan.verbatim == "shared" and plan.shared.keep_by == "surprisal" and plan.target_source == "oracle"
    spliced = compress_with(tiny_llama, transcript, (1, 5), get_method("vkv", recipe=plan, per_turn=True), 3.2)
    rendered = render(transcript, tiny_llama.tokenizer)
    spans = [(s.start, s.end) for s in rendered.spans]  # as `vkv eval` splices: the text before and after whole
    assert [tuple(s.span) for s in spliced.segments] == [spans[0], *spans[1:5], (spans[5][0], spans[-1][1])]
    assert spliced.next_position == len(rendered.ids)
    path = tmp_path / "multi.safetensors"
    save_cache(spliced, path)
    rows = report_rows(read_header(path))
    assert [r["role"] for r in rows[1:5]] == [m.role for m in transcript.messages[1:5]]
    assert [r["kind"] for r in rows] == ["verbatim"] + ["hybrid"] * 4 + ["verbatim"]
    for row, segment in zip(rows[1:5], spliced.segments[1:5]):
        assert row["verbatim_kept"] == len(segment.stats["verbatim_positions"]) > 0
        ids = [rendered.ids[p] for p in segment.stats["verbatim_positions"]]
        assert row["verbatim_text"] == [tiny_llama.tokenizer.decode([i]) for i in ids]
    totals = report_totals(rows)
    assert totals["compressed_ratio"] == pytest.approx(3.2, abs=0.3)
    with pytest.raises(VkvError, match="field max_loss: auto-ratio needs a tolerance"):
        recipe_from_args(build_parser().parse_args(["compress", "t.json", "--out", "c.safetensors", "--auto-ratio"]))


def test_a_recipe_saved_by_an_earlier_version_loads_in_todays_spelling():
    """Sessions and caches written before the ratio left the recipe and head_share became head_budget still load."""
    old = {
        "compress": {"ratio": 3.2, "head_share": "all", "optim": {"steps": 3}},
        "targets": "online",
        "hybrid": {"fraction": 0.2, "keep_by": "surprisal"},
        "auto_ratio": None,
    }
    config = VkvRecipe.from_dict(old)
    assert config.target_source == "online" and config.verbatim == "shared" and not config.auto_ratio
    assert config.shared.fraction == 0.2 and config.shared.keep_by == "surprisal"
    assert config.compress.head_budget == "shared" and config.compress.optim.steps == 3
    assert VkvRecipe.from_dict(config.to_dict()) == config
    with pytest.raises(VkvError, match="unknown CompressConfig setting"):
        VkvRecipe.from_dict({"compress": {"head_shares": "all"}})


def test_a_session_with_the_default_recipe_keeps_compact_turns_that_save_load_and_answer(
    tiny_llama, transcript, tmp_path
):
    """The default recipe (a per-head verbatim share, ranked per turn by the reconstruction pass on the running cache)
    gives compact turns: each head holds only what it reaches, so the session's memory is the budget's."""
    recipe = VkvRecipe(CompressConfig(optim=OptimConfig(steps=1)), target_source="online")
    s = Session(tiny_llama, get_method("vkv", recipe=recipe))
    s.extend(list(transcript.messages[:5]))
    s.compress(turns=(1, 4), ratio=4.0)
    kinds = [segment.kind for segment in s.cache.segments]
    assert kinds == ["verbatim", "compact", "compact", "compact", "verbatim"]
    turns = s.turns[1:4]
    budgets = allocate([t.length for t in turns], span_budget(sum(t.length for t in turns), 4.0))
    assert [segment.real_entries for segment in s.cache.segments[1:4]] == pytest.approx(budgets)
    assert s.cache.physical_length < len(s.ids)
    s.save(tmp_path / "s.safetensors")
    restored = Session.load(tmp_path / "s.safetensors", tiny_llama)
    assert restored.method.settings() == s.method.settings() and s.method.settings().compress.verbatim_share > 0
    assert torch.equal(question_logits(tiny_llama, s, s.cache), question_logits(tiny_llama, restored, restored.cache))
