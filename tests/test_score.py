"""`vkv score`: a conversation's held-out last messages predicted from its compressed history, no questions needed."""

import json
import math

import pytest

import vkv
from tests.conftest import FIXTURES
from vkv.cli import main
from vkv.errors import VkvError
from vkv.evals.score import ScoreEval, ScoreSettings
from vkv.methods import METHODS, get_method
from vkv.text.transcript import load_transcript, parse_transcript

MINI = FIXTURES / "mini-agent.json"  # system, user, assistant, tool, assistant, user, assistant, tool


@pytest.fixture(scope="module")
def scored(smol):
    return ScoreEval(smol, load_transcript(MINI))


def test_full_keeps_everything_and_none_nothing(scored):
    full = scored.evaluate(get_method("full"), None)["summary"]
    none = scored.evaluate(get_method("none"), None)["summary"]
    assert full["ll_full"] > full["ll_none"]  # the history helps the real model predict its own continuation
    assert full["kept"] == 1 and full["kl"] == 0 and full["ll"] == full["ll_full"]
    assert none["kept"] == 0 and none["kl"] > 0 and none["ll"] == none["ll_none"]


def test_default_holds_out_the_last_assistant_message_and_scores_only_assistant_tokens(scored, smol):
    transcript = load_transcript(MINI)
    assert scored.held_turns == (6, 8) and len(scored.transcript.messages) == 6
    text = smol.tokenizer.decode([scored.held[i] for i in scored.scored])
    assert text.startswith(transcript.messages[6].content)  # the assistant prompt is given, not predicted
    assert transcript.messages[7].content not in text  # the tool output after it is not a prediction
    by_three = ScoreEval(smol, transcript, ScoreSettings(holdout=3))
    assert by_three.held_turns == (5, 8)
    text = smol.tokenizer.decode([by_three.held[i] for i in by_three.scored])
    assert transcript.messages[6].content in text and transcript.messages[5].content not in text


def test_a_method_keeps_a_finite_share_and_never_sees_the_held_out_messages(smol, monkeypatch):
    seen = []
    for cls in METHODS.values():
        original = cls.compress
        monkeypatch.setattr(
            cls,
            "compress",
            lambda self, work, *a, _original=original, **kw: seen.append(work) or _original(self, work, *a, **kw),
        )
    transcript = load_transcript(MINI)
    record = vkv.score(smol, None, transcript, method="snapkv", ratio=4.0)
    assert record["method"] == "snapkv" and math.isfinite(record["summary"]["kept"])
    assert record["ratio_achieved"] == pytest.approx(4.0, rel=0.05) and record["summary"]["kl"] > 0
    [work] = seen
    cut = ScoreEval(smol, transcript).cut
    assert len(work.ids) == work.end == cut  # the history only: the work ends where the held-out part begins
    assert transcript.messages[6].content not in smol.tokenizer.decode(work.ids)


def test_a_transcript_without_questions_is_scored_from_the_command_line(tmp_path, test_model_dir, capsys):
    data = json.loads(MINI.read_text())
    del data["questions"]
    path, out = tmp_path / "plain.json", tmp_path / "score.json"
    path.write_text(json.dumps(data))
    argv = ["score", str(path), "--model", "smollm2-135m", "--method", "full,none,truncate", "--ratio", "2,4"]
    assert main([*argv, "--holdout", "2", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [(r["method"], r["ratio_requested"]) for r in results] == [
        ("full", None),
        ("none", None),
        ("truncate", 2.0),
        ("truncate", 4.0),
    ]
    for r in results:
        assert {"config", "seed", "ratio_achieved", "cache_memory_bytes", "span_memory_bytes", "seconds"} <= set(r)
        assert r["held_out"]["messages"] == [6, 8] and r["score"]["holdout"] == 2
    kept = [r["summary"]["kept"] for r in results]
    assert kept[:2] == [1, 0] and all(math.isfinite(k) for k in kept)
    assert "truncate" in capsys.readouterr().out


@pytest.mark.parametrize("holdout", ["0", "7", "1"])
def test_a_holdout_with_nothing_to_compress_or_predict_is_refused_naming_the_flag(holdout, capsys):
    argv = ["score", str(MINI), "--model", "smollm2-135m", "--method", "full", "--holdout", holdout]
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse's usage comes first for an out-of-range flag
    assert "--holdout" in last and "error" in last


def test_a_conversation_with_no_reply_to_hold_out_is_refused(tiny_llama):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    with pytest.raises(VkvError, match="no assistant message"):
        ScoreEval(tiny_llama, parse_transcript({"id": "lonely", "messages": messages}))


def test_an_openai_style_export_is_scored_in_python(tiny_llama):
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Which port does the server use?"},
        {"role": "assistant", "content": "It listens on port 8080, set in config.toml."},
        {"role": "user", "content": "Remind me of the port."},
        {"role": "assistant", "content": "Port 8080."},
    ]
    record = vkv.score(tiny_llama, None, messages, method="truncate", ratio=2.0)
    assert record["held_out"]["messages"] == [4, 5] and record["span_tokens"] > 0
    assert record["summary"]["ll"] < 0 and record["summary"]["kl"] >= 0
