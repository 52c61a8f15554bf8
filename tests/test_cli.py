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
    err = capsys.readouterr().out
    assert "error:" in err and "bad.json" in err and "Traceback" not in err
    assert main(["doctor", "--model", "smollm2-135m", "--quant", "fp32", "--device", "cuda:7"]) == 2


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "doctor" in capsys.readouterr().out


@pytest.mark.integration
def test_doctor_8bit_cli_writes_json(test_model_dir, tmp_path):
    out = tmp_path / "doctor.json"
    assert main(["doctor", "--model", "smollm2-135m", "--quant", "8bit", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["quant"] == "8bit" and report["grad_norm"] > 0
