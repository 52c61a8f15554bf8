"""`vkv bench scaling`: the exponent fit, and a run end to end on the test model at two short lengths (its timings are
printed, never asserted)."""

import json

import pytest

from vkv.cli import main
from vkv.tools.bench_scaling import exponents, phase_exponents


@pytest.mark.parametrize("power", [1.0, 1.5, 2.0])
def test_the_exponent_is_the_log_log_slope(power):
    records = [{"method": "m", "span_tokens": n, "seconds": 0.003 * n**power} for n in (500, 1000, 2000, 4000)]
    assert exponents(records) == {"m": pytest.approx(power, abs=1e-3)}
    assert exponents(records[:1]) == {"m": None}  # one length fits no line


def test_phase_exponents_come_from_the_phase_times():
    records = [
        {"method": "vkv", "span_tokens": n, "seconds": n**2, "phases": {"optimise": n**2.0, "targets": n}}
        for n in (100, 200, 400)
    ]
    assert phase_exponents(records) == {"vkv": {"optimise": pytest.approx(2.0), "targets": pytest.approx(1.0)}}


@pytest.mark.integration
def test_bench_scaling_times_every_method_at_every_length(test_model_dir, tmp_path, capsys):
    out = tmp_path / "scaling.json"
    argv = ["bench", "scaling", "--lengths", "256,320", "--methods", "truncate,knorm", "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert set(report["exponents"]) == {"prefill", "truncate", "knorm"}
    assert all(e is not None for e in report["exponents"].values())
    assert sorted({r["window_tokens"] for r in report["records"]}) == [256, 320]
    assert len(report["records"]) == 6 and all(r["seconds"] >= 0 for r in report["records"])
    assert "exponent" in capsys.readouterr().out


def test_a_length_past_the_transcript_is_refused_in_one_sentence(tmp_path, capsys):
    argv = ["bench", "scaling", "--lengths", "99999", "--methods", "truncate", "--json", str(tmp_path / "s.json")]
    assert main(argv) == 2
    assert "field lengths: 99999 tokens do not fit" in capsys.readouterr().err
