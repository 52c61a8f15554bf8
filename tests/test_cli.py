import json

import pytest

from vkv.cli import main


def test_render_prints_tiling_spans(mini_transcript_path, test_model_dir, tmp_path, capsys):
    out = tmp_path / "spans.json"
    assert main(["render", str(mini_transcript_path), "--model", "smollm2-135m", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "spans tile" in printed and "yes" in printed
    spans = json.loads(out.read_text())["spans"]
    assert [s["turn"] for s in spans] == list(range(8))


def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert main(["render", str(bad), "--model", "smollm2-135m"]) == 2
    printed = capsys.readouterr()
    assert "error:" in printed.err and "bad.json" in printed.err and "Traceback" not in printed.err
    assert not printed.out
    assert main(["doctor", "--model", "smollm2-135m", "--quant", "fp32", "--device", "cuda:7"]) == 2


def test_help_lists_commands(capsys):
    assert main(["--help"]) == 0  # argparse's exit code, returned
    assert "doctor" in capsys.readouterr().out


def test_a_shared_method_flag_says_each_methods_default(capsys):
    assert main(["eval", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "kvzip: global" in text and "knorm: shared" in text  # kvzip spends its budget as its authors do


@pytest.mark.integration
def test_doctor_8bit_cli_writes_json(test_model_dir, tmp_path):
    out = tmp_path / "doctor.json"
    assert main(["doctor", "--model", "smollm2-135m", "--quant", "8bit", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["quant"] == "8bit" and report["grad_norm"] > 0


def test_plan_cli_fits_the_reference_setup_and_refuses_a_tiny_gpu(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert (
        main(
            [
                "plan",
                "--model",
                "Qwen/Qwen2.5-Coder-7B-Instruct",
                "--window",
                "4096",
                "--ratio",
                "3.2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    plan = json.loads(out.read_text())
    assert plan["virtual_tokens"] == 1280 and plan["peak"] < 32 * 2**30
    assert "fits" in capsys.readouterr().out
    assert main(["plan", "--model", "Qwen/Qwen2.5-Coder-7B-Instruct", "--memory", "8"]) == 1
    assert main(["plan", "--model", "no/such-model"]) == 2


def test_lamr_commands_build_a_corpus_and_prune_needs_a_checkpoint(tmp_path, test_model_dir, capsys):
    source = tmp_path / "src"
    source.mkdir()
    for i in range(6):
        (source / f"m{i}.py").write_text(
            "".join(f"def f{i}_{j}(x):\n    y = x + {j}\n    return y * 2\n\n\n" for j in range(8))
        )
    out = tmp_path / "corpus.jsonl"
    assert (
        main(
            [
                "lamr",
                "build-corpus",
                "--out",
                str(out),
                "--sources",
                str(source),
                "--records",
                "5",
                "--min-lines",
                "6",
                "--max-lines",
                "20",
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records and all(set(r) == {"query", "code", "kept_frags", "score"} for r in records)
    target = source / "m0.py"
    assert main(["prune", str(target), "--backend", "lamr", "--query", "what does f0_1 return?"]) == 2
    assert "--checkpoint is required" in capsys.readouterr().err


def test_no_model_on_a_machine_without_a_gpu_is_refused_naming_the_small_model(monkeypatch, capsys):
    from tests.conftest import FIXTURES

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("vkv.lm.load.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    transcript = str(FIXTURES / "mini-agent.json")
    for argv in (["eval", transcript], ["compress", transcript, "--out", "c.safetensors"], ["chat", transcript]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) <= 2  # one sentence (wrapped at most once on the console's width)
        err = " ".join(err.split())
        assert "--model smollm2-135m" in err and "needs a GPU" in err and "Traceback" not in err
