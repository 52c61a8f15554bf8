"""`vkv plan --method`: every method's planned peak from a model config, for both users' dtypes, growing with the
window, and within a factor of what kvzip and am measure on the test model."""

import json

import pytest

from vkv.cli import main
from vkv.tools.memory import GIB, load_config
from vkv.tools.method_memory import METHODS, plan_method

QWEN = "Qwen/Qwen2.5-Coder-7B-Instruct"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("quant", ["bf16", "8bit"])
def test_every_method_plans_for_both_dtypes_and_grows_with_the_window(method, quant):
    config = load_config(QWEN)
    short, long = (plan_method(config, method, quant=quant, window=w, capacity_gib=32) for w in (8192, 32768))
    assert short.weights == long.weights
    assert 0 < short.working < long.working and short.window_kv < long.window_kv and short.total < long.total
    assert short.host_total < long.host_total
    assert {name for name, _, _ in short.stages} >= {"prefill"} and short.peak_stage in dict(
        (n, s) for n, s, _ in short.stages
    )
    assert short.fits == (short.total <= 32 * GIB)


def test_8bit_weights_are_about_half_of_bf16():
    config = load_config(QWEN)
    bf16, int8 = (plan_method(config, "kvzip", quant=q, window=8192).weights for q in ("bf16", "8bit"))
    assert 14 < bf16 / GIB < 15  # 7.6 G parameters
    assert 0.5 < int8 / bf16 < 0.6  # int8 linear layers, fp16 embeddings and LM head


def test_vkv_method_plan_keeps_vkv_plans_optimisation():
    from vkv.tools.memory import plan

    config = load_config(QWEN)
    p = plan(config, quant="8bit", window=7680, device="cuda")
    m = plan_method(config, "vkv", quant="8bit", window=7680)
    assert dict((n, s) for n, s, _ in m.stages)["optimisation"] == p.optimisation_working
    assert m.total == p.optimisation_phase  # the optimisation is vkv's largest stage here, as `vkv plan` says


def test_plan_cli_method_all_writes_every_method(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["plan", "--model", QWEN, "--method", "all", "--quant", "8bit", "--window", "8192", "--json", str(out)]
    assert main(argv) == 1  # vkv's all-virtual optimisation does not fit 32 GiB at 8k
    printed = capsys.readouterr().out
    assert "not measured" in printed
    written = json.loads(out.read_text())
    assert [p["method"] for p in written["methods"]] == list(METHODS)
    assert all(p["planned"] for p in written["methods"])
    assert main(["plan", "--model", QWEN, "--method", "kvzip", "--window", "8192"]) == 0
    assert main(["plan", "--model", QWEN, "--method", "nosuch"]) == 2


MEASURE = """
import json, sys, torch
from vkv.lm.load import load_model
from vkv.methods import get_method
from vkv.text.transcript import load_transcript, render
from vkv.tools.bench_scaling import window_work
from vkv.tools.measure import working_memory
from vkv.tools.method_memory import plan_method

method, path = sys.argv[1], sys.argv[2]
smol = load_model("smollm2-135m", quant="fp32", device="cpu")
transcript = load_transcript(path)
rendered = render(transcript, smol.tokenizer)
length = min(len(rendered.ids), 600)
work = window_work(smol, transcript, rendered, length, 0, "tokens")
get_method(method).compress(work, 3.2)  # one-time allocations (thread pools) before measuring
work = window_work(smol, transcript, rendered, length, 0, "tokens")
torch.manual_seed(0)
with working_memory(smol.device) as mem:
    get_method(method).compress(work, 3.2)
p = plan_method(smol.model.config, method, quant="fp32", window=work.end, span=work.end - work.start, device="cpu")
planned = max(size for name, size, _ in p.stages if name != "prefill") + dict((n, s) for n, s, _ in p.host)["read-out queries"]
print(json.dumps({"measured_mb": mem["mb"], "planned_mb": planned / 2**20}))
"""


@pytest.mark.integration
@pytest.mark.parametrize("method", ["kvzip", "am"])
def test_plan_is_within_a_factor_of_the_measured_peak(method, test_model_dir, mini_transcript_path):
    """On the CPU every stage runs in host memory: what one compression adds on top of the loaded model and the
    prefilled window is compared with the plan's largest stage beyond the prefill and the read-out's queries. Measured
    in a process of its own: a long test session's freed and fragmented heap would inflate the resident peak."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", MEASURE, method, str(mini_transcript_path)], capture_output=True, text=True, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if found["measured_mb"] is None:
        pytest.skip("peak RSS cannot be reset on this platform")
    ratio = found["planned_mb"] / max(found["measured_mb"], 1.0)
    assert 0.5 < ratio < 2.0, found
