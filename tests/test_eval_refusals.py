"""`vkv eval` refuses what would make its numbers meaningless: questions whose answer the uncompressed context or the
question gives away (as `vkv validate` does; `--allow-leaks` scores them), a method or ratio listed twice, an empty
item in a list."""

import json

import pytest

from tests.conftest import FIXTURES
from vkv.cli import main
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.text.transcript import load_transcript


def leaking_copy(tmp_path):
    data = json.loads((FIXTURES / "mini-agent.json").read_text())
    keyword = data["questions"][0]["accept"][0]
    data["messages"][0]["content"] += f" (note: {keyword})"  # the system message is never compressed
    path = tmp_path / "leaky.json"
    path.write_text(json.dumps(data))
    return path, keyword


def test_a_question_answered_by_the_verbatim_context_is_refused(tmp_path, tiny_llama):
    path, keyword = leaking_copy(tmp_path)
    transcript = load_transcript(path)
    with pytest.raises(VkvError, match=f"accepted keyword '{keyword}' leaks into messages\\[0\\].*--allow-leaks"):
        TranscriptEval(tiny_llama, transcript, settings=EvalSettings(max_new_tokens=1))
    assert TranscriptEval(tiny_llama, transcript, settings=EvalSettings(max_new_tokens=1), allow_leaks=True).questions


def test_the_cli_refuses_leaks_and_repeated_or_empty_list_items(tmp_path, capsys):
    path, keyword = leaking_copy(tmp_path)
    model = ["--model", "smollm2-135m", "--device", "cpu"]
    assert main(["eval", str(path), *model, "--method", "none"]) == 2
    assert f"'{keyword}' leaks into messages[0]" in capsys.readouterr().err
    assert main(["eval", str(path), *model, "--method", "none", "--allow-leaks"]) == 0
    mini = str(FIXTURES / "mini-agent.json")
    assert main(["eval", mini, *model, "--method", "kvzip,none,kvzip"]) == 2
    assert "--method: kvzip listed twice" in capsys.readouterr().err
    assert main(["eval", mini, *model, "--method", "kvzip", "--ratio", "4,4.0"]) == 2
    assert "--ratio: 4.0 listed twice" in capsys.readouterr().err
    assert main(["eval", mini, *model, "--method", "kvzip", "--ratio", "3.2,,4"]) == 2
    assert "--ratio: an empty item in '3.2,,4'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "refusal"),
    [
        (
            ["--method", "kvzip,am", "--auto-ratio"],
            "--auto-ratio: none of the methods kvzip, am takes it (vkv's recipe does)",
        ),
        (
            ["--method", "vkv", "--target-source", "oracle"],  # online, the default, is harmless anywhere
            "--target-source: it sets the targets of a run turn by turn (--per-turn, --every or --auto-ratio)",
        ),
        (
            ["--method", "vkv", "--verbatim-fraction", "0.2"],
            "--verbatim-fraction: it sets the shared verbatim part, which only --verbatim shared (or shared+per-head) keeps",
        ),
        (["--method", "kvzip", "--steps", "5"], "--steps: none of the methods kvzip takes it (vkv's recipe does)"),
        (
            ["--method", "kvopt", "--distill-probes", "summary"],
            "--distill-probes: none of the methods kvopt takes it (vkv's recipe does)",
        ),
    ],
)
def test_a_recipe_flag_no_method_takes_is_refused_before_the_model_loads(flags, refusal, capsys):
    assert main(["eval", str(FIXTURES / "mini-agent.json"), "--model", "smollm2-135m", *flags]) == 2
    assert refusal in " ".join(capsys.readouterr().err.split())


def test_verbatim_and_target_settings_go_to_the_runs_that_use_them(capsys):
    """The shared part's settings go to vkv keeping shared tokens (alone or beside a per-head part), the target source
    to a running cache in chunks (--every) as to a per-turn run: the run goes on to the next check (a ratio the span
    cannot take), where a run without them stops at the flag."""
    argv = ["eval", str(FIXTURES / "mini-agent.json"), "--model", "smollm2-135m", "--method", "vkv", "--ratio", "1000"]
    for flags in (
        ["--verbatim", "shared", "--verbatim-fraction", "0.2"],
        ["--verbatim", "shared+per-head", "--verbatim-fraction", "0.2"],
        ["--every", "64", "--target-source", "oracle"],
    ):
        assert main([*argv, *flags]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert flags[-2] not in err and "field ratio: 1000.0 leaves less than one entry" in err, flags
