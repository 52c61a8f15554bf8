"""Progress goes to stderr, as plain lines with counts, elapsed time and time left when stderr is not a terminal, and
stdout keeps the results."""

import io
import time

import pytest
from rich.console import Console

from tests.conftest import FIXTURES
from vkv.progress import LineProgress, counted, status, step_bar


def test_a_bar_off_a_terminal_prints_plain_lines_on_stderr(capsys):
    with counted("eval: 2 unit(s) × 2 run(s)", 4) as done:
        with step_bar("t vkv @ 3.2×", 3) as on_step:
            for step in (1, 2, 3):
                on_step(step, 0.5 / step)
        done()
        with status("t: full and none references"):
            pass
        for _ in range(3):
            done()
    captured = capsys.readouterr()
    assert not captured.out  # stdout keeps the results
    lines = captured.err.splitlines()
    assert lines[0] == "eval: 2 unit(s) × 2 run(s): 0/4 (0%), 0s elapsed"
    assert any(line.startswith("t vkv @ 3.2×: done 3/3 in ") and "loss 0.1667" in line for line in lines)
    assert any(line.startswith("t: full and none references: done in ") for line in lines)
    assert lines[-1].startswith("eval: 2 unit(s) × 2 run(s): done 4/4 in ")
    assert "\x1b[" not in captured.err  # no terminal control codes in a log


def test_a_long_silent_task_still_reports_and_counts_give_the_time_left():
    out = io.StringIO()
    with LineProgress(Console(file=out, width=200), period=0.01) as progress:
        task = progress.add_task("prefill")
        deadline = time.monotonic() + 30
        while out.getvalue().count("prefill:") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the ticker reports a task that says nothing for a period
        progress.remove_task(task)
        counted_task = progress.add_task("sweep", total=4)
        progress.update(counted_task, completed=2)
        line = progress.tasks[counted_task].line(progress.tasks[counted_task].started + 60)
    assert out.getvalue().count("prefill:") >= 3  # started, still running, done
    assert line == "sweep: 2/4 (50%), 1m00s elapsed, ~1m00s left"


@pytest.mark.integration
def test_eval_keeps_stdout_for_results_and_reports_progress_on_stderr(test_model_dir, capsys):
    from vkv.cli import main

    argv = ["eval", str(FIXTURES / "mini-agent.json"), "--model", "smollm2-135m", "--quant", "fp32"]
    assert main([*argv, "--method", "full,none", "--max-new-tokens", "2"]) == 0
    captured = capsys.readouterr()
    assert "factual-recall evaluation" in captured.out and "references" not in captured.out
    assert "eval: 1 unit(s) × 2 run(s): 0/2" in captured.err and "eval: 1 unit(s) × 2 run(s): done 2/2" in captured.err
    assert "loading smollm2-135m (fp32): done in" in captured.err
