"""The agent's loop: a span compressed in chunks of messages on the running cache (`every`), its recent messages kept
verbatim (`recent`), and under a cap on the entries per KV head (`cap`, on average, as the ratio counts), which the
history never exceeds however long the conversation grows: in the segments, in the decoding cache, in a saved
session's file and as `vkv inspect --json` reports it."""

import json

import pytest
import torch

import vkv
from tests.conftest import FIXTURES
from vkv.api.session import message_dict
from vkv.cli import main
from vkv.compress.compaction import SpanReadout, row_stats
from vkv.compress.config import CompressConfig
from vkv.compress.history import History
from vkv.compress.optimise import OptimConfig
from vkv.compress.recipe import VkvRecipe
from vkv.compress.turn import Turn, chunk_turns, message_turns
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.segment import most_entries_per_head
from vkv.lm.context import Context
from vkv.methods import get_method
from vkv.sweep import load_experiment, plan
from vkv.text.transcript import load_transcript

RATIO = 2.0
EVERY = 48
CAP = 20  # entries per head: the mini transcript's span is over 10 times as long


@pytest.fixture(scope="module")
def evaluation(tiny_llama_module):
    transcript = load_transcript(FIXTURES / "mini-agent.json")
    return TranscriptEval(tiny_llama_module, transcript, settings=EvalSettings(max_new_tokens=1))


@pytest.fixture(scope="module")
def tiny_llama_module(smol_tokenizer):
    from tests.conftest import build_tiny

    return build_tiny("llama", smol_tokenizer)


def quick_vkv(**loop):
    recipe = VkvRecipe(compress=CompressConfig(optim=OptimConfig(steps=2)))
    return get_method("vkv", recipe=recipe, **loop)


def test_chunks_close_once_they_hold_every_tokens():
    turns = [Turn(i, i + 1, "user", 10 * i, 10 * i + 10) for i in range(5)]
    chunks = chunk_turns(turns, 25)
    assert [(c.first, c.last, c.start, c.end) for c in chunks] == [(0, 3, 0, 30), (3, 5, 30, 50)]
    assert chunk_turns(turns, 1) == turns  # a chunk of one message is that message
    assert chunk_turns(turns, 1000) == [Turn(0, 5, None, 0, 50)]


@pytest.mark.parametrize("name", ["kvzip", "snapkv", "am"])
def test_every_compresses_each_chunk_on_the_running_cache(evaluation, name):
    work = evaluation.work
    turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
    chunks = chunk_turns(turns, EVERY)
    assert 1 < len(chunks) < len(turns)
    group = get_method(name, every=EVERY).compress(work, RATIO)
    assert [s.span for s in group] == [(c.start, c.end) for c in chunks]
    assert group.stats["every"] == EVERY and group.stats["turns"] == len(chunks)
    assert group.real_entries == pytest.approx(work.budget(RATIO), abs=1.0)


@pytest.mark.parametrize("loop", [{"every": EVERY}, {"per_turn": True}])
@pytest.mark.parametrize("name", ["kvzip", "snapkv", "am", "vkv"])
def test_a_capped_loop_never_holds_more_than_its_cap(evaluation, name, loop):
    work = evaluation.work
    assert work.span_length > 10 * CAP
    method = quick_vkv(cap=CAP, **loop) if name == "vkv" else get_method(name, cap=CAP, **loop)
    held = []
    cap = method.history_cap()
    compact = cap.compact

    def watched(history_work, entries):  # every compaction's input was over the cap, its output within it
        held.append(history_work.history.segment().real_entries)
        return compact(history_work, entries)

    cap.compact = watched
    method.history_cap = lambda: cap
    group = method.compress(work, RATIO)
    assert held and all(h > CAP for h in held)
    assert group.real_entries <= CAP + 1e-6 and group.stats["entries_per_head"] <= CAP
    assert group.stats["max_entries_per_head"] == most_entries_per_head(list(group))
    cache = Context(work.lm, evaluation.splice(list(group))).cache
    prefix = work.start  # the system message, verbatim, before the capped history
    held = 0  # entries the decoding cache holds, over every layer and KV head
    for layer in cache.layers:
        dense = torch.full((layer.keys.shape[1],), layer.keys.shape[2])
        if layer.bias is not None:
            dense = torch.isfinite(layer.bias[0]).sum(-1)
        held += int(dense.sum()) + (sum(layer.flat.counts) if layer.flat is not None else 0)
    heads = len(cache.layers) * cache.layers[0].keys.shape[1]
    assert held - prefix * heads <= CAP * heads
    assert evaluation.measure(evaluation.splice(list(group)))[0]  # the capped cache answers


def test_a_history_kept_whole_reads_as_before(evaluation):
    """History.of and keep lose nothing: every entry kept gives back the same attention outputs."""
    group = get_method("kvzip", every=EVERY).compress(evaluation.work, RATIO)
    history = History.of(list(group))
    slots = history.keys.shape[2]
    everything = torch.arange(slots).expand(*history.keys.shape[:2], -1)
    order = torch.where(history.real, everything, everything + slots).sort(-1).values
    counts = history.real.sum(-1)
    index = torch.where(torch.arange(slots) < counts[..., None], order, order[..., :1])[..., : int(counts.max())]
    real = torch.arange(index.shape[-1]) < counts[..., None]
    kept = history.keep(index, real)
    q = torch.randn(*history.keys.shape[:2], 5, history.keys.shape[-1])

    def read(keys, values, bias):
        return ((q @ keys.transpose(-1, -2)) + bias[..., None, :]).softmax(-1) @ values

    expected = read(history.keys, history.values, history.bias)
    torch.testing.assert_close(read(kept.keys, kept.values, kept.bias), expected)


def test_a_method_without_a_rule_for_its_own_entries_refuses_a_cap(evaluation):
    with pytest.raises(VkvError, match="knorm has no rule for compacting its own entries.*kvzip"):
        get_method("knorm", every=EVERY, cap=CAP).compress(evaluation.work, RATIO)
    with pytest.raises(VkvError, match="a cap bounds a running cache; set per_turn or every"):
        get_method("kvzip", cap=CAP)
    with pytest.raises(VkvError, match="are two loops; set one"):
        get_method("am", per_turn=True, every=EVERY)


def test_a_capped_session_grown_past_ten_times_its_cap_holds_it_in_memory_and_on_disk(
    tiny_llama_module, tmp_path, capsys
):
    transcript = load_transcript(FIXTURES / "mini-agent.json")
    session = vkv.Session(tiny_llama_module, get_method("kvzip", every=EVERY, cap=CAP))
    session.append(message_dict(transcript.messages[0]))
    for message in transcript.messages[1:]:  # the agent's loop: each message compressed when it arrives
        session.append(message_dict(message))
        session.compress(ratio=RATIO)
        compressed = [s for s in session.cache.segments if s.compressed]
        assert sum(s.real_entries for s in compressed) <= CAP + 1e-6
    assert session.ids and len(session.ids) - session.turns[0].end > 10 * CAP
    assert session.by_messages and session.compressed_through() == len(session.messages)
    path = tmp_path / "capped.safetensors"
    session.save(path)
    loaded = vkv.Session.load(path, tiny_llama_module)
    assert [s.span for s in loaded.cache.segments] == [s.span for s in session.cache.segments]
    assert main(["inspect", str(path), "--json", str(tmp_path / "capped.json")]) == 0
    capsys.readouterr()
    storage = json.loads((tmp_path / "capped.json").read_text())["storage"]
    assert storage["compressed_entries_per_head"] == round(sum(s.real_entries for s in compressed), 2) <= CAP
    assert storage["compressed_max_entries_per_head"] == most_entries_per_head(compressed)
    assert storage["max_entries_per_head"] == storage["compressed_max_entries_per_head"] + session.turns[0].length
    assert loaded.ask("Which library hashes passwords?", max_new_tokens=2) is not None


def test_a_session_in_chunks_compresses_again_after_its_last_chunk(tiny_llama_module):
    transcript = load_transcript(FIXTURES / "mini-agent.json")
    session = vkv.Session(tiny_llama_module, get_method("snapkv", every=EVERY))
    session.extend([message_dict(m) for m in transcript.messages[:5]])
    session.compress(ratio=RATIO)
    first = len(session.cache.segments)
    assert first < 5  # chunks of messages, not one segment each
    session.extend([message_dict(m) for m in transcript.messages[5:]])
    with pytest.raises(VkvError, match="already compressed"):
        session.compress((2, 6), RATIO)
    session.compress(ratio=RATIO)
    assert session.compressed_through() == len(transcript.messages)
    messages = session.segment_messages()
    assert session.by_messages and messages[-1][1] == len(transcript.messages)
    assert all(a[1] == b[0] for a, b in zip(messages, messages[1:]))


def test_loop_fields_reach_every_front_door(tmp_path, capsys):
    assert "every" not in get_method("am").config()  # runs recorded before chunks and caps keep their ids
    assert get_method("am", every=EVERY, cap=CAP).config()["cap"] == CAP
    assert quick_vkv(every=EVERY, cap=CAP).config()["every"] == EVERY
    recorded = quick_vkv(every=EVERY, cap=CAP, recent=8).config()  # a run record reads back with every loop field
    rebuilt = type(quick_vkv()).from_config(recorded)
    assert (rebuilt.every, rebuilt.cap, rebuilt.recent, rebuilt.config()) == (EVERY, CAP, 8, recorded)
    door = ["eval", str(FIXTURES / "mini-agent.json"), "--model", "smollm2-135m", "--method", "lamr", "--every", "64"]
    assert main(door) == 2
    assert "--every: method 'lamr' has no such mode" in capsys.readouterr().err
    sweep = tmp_path / "loop.toml"
    sweep.write_text(
        f"""name = "loop"
[defaults]
model = "smollm2-135m"
transcripts = ["{FIXTURES / "mini-agent.json"}"]
[[grid]]
methods = ["kvzip"]
ratios = [2.0]
kvzip = {{ every = [{EVERY}], cap = [0, {CAP}] }}
"""
    )
    runs = plan(load_experiment(sweep), "cpu")
    assert sorted(r.identity["config"].get("cap", 0) for r in runs) == [0, CAP]
    assert all(r.identity["config"]["every"] == EVERY for r in runs)


def test_a_biased_entry_reads_as_its_copies_in_am_s_statistics():
    """A history entry carrying bias log 2 draws what two copies of it would: the refit's targets see the biases."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 7, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    biased = SpanReadout(q, k, v, torch.tensor([[2.0, 1.0, 1.0]] * 2).log())
    copies = SpanReadout(q, torch.cat([k[:, :1], k], 1), torch.cat([v[:, :1], v], 1))
    got, want = row_stats(biased), row_stats(copies)
    torch.testing.assert_close(got.outputs, want.outputs)
    torch.testing.assert_close(got.mass.log() + got.log_max, want.mass.log() + want.log_max)  # the absolute mass
    torch.testing.assert_close(biased.log_mass(), copies.log_mass())


@pytest.mark.parametrize("name", ["kvzip", "vkv"])
def test_recent_messages_stay_verbatim_within_the_budget(evaluation, name):
    work = evaluation.work
    turns = message_turns(work.message_starts, work.message_roles, work.start, work.end)
    recent = work.end - turns[-2].start  # the last two messages
    method = quick_vkv(every=EVERY, recent=recent) if name == "vkv" else get_method(name, every=EVERY, recent=recent)
    group = method.compress(work, RATIO)
    assert [(s.kind, s.span) for s in group[-2:]] == [("verbatim", (t.start, t.end)) for t in turns[-2:]]
    assert all(s.compressed for s in group[:-2]) and group[-3].span[1] == turns[-2].start
    assert group.real_entries == pytest.approx(work.budget(RATIO), abs=1.0)
    assert group.stats["recent"] == recent
    with pytest.raises(VkvError, match="recent tokens kept verbatim leave"):
        get_method(name if name != "vkv" else "kvzip", every=EVERY, recent=work.span_length - 10).compress(work, 8.0)
