"""`vkv compress --method M` writes the entries `vkv eval --method M` scores: one code path (SpanWork.capture,
Method.compress, splice) for every registered KV method, checked tensor for tensor on the test model."""

import pytest
import torch

from vkv.cli import build_parser, main
from vkv.cli.compress import kv_methods
from vkv.cli.method_flags import build_method, given_options, method_class, recipe_from_args
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.file import read_cache
from vkv.methods import METHODS
from vkv.text.transcript import load_transcript

RATIO = 4.0
TURNS = (3, 5)  # --span turns:3-4
STEPS = 2


def eval_method(name: str, transcript: str):
    """The method as `vkv eval T --method name --steps 2` builds it."""
    cls = METHODS[name]
    flags = ["--steps", str(STEPS)] if cls.recipe_class else []
    args = build_parser().parse_args(["eval", transcript, "--method", name, *flags])
    return build_method(cls, recipe_from_args(args), args, given_options(args, [cls]))


@pytest.fixture(scope="module")
def evaluation(smol, mini_transcript_path_module):
    transcript = load_transcript(mini_transcript_path_module)  # later turns stay verbatim: only the entries matter here
    return TranscriptEval(smol, transcript, TURNS, EvalSettings(max_new_tokens=1), allow_leaks=True)


@pytest.fixture(scope="module")
def mini_transcript_path_module():
    from tests.conftest import FIXTURES

    return FIXTURES / "mini-agent.json"


@pytest.mark.parametrize("name", [n for n in kv_methods() if n != "reuse"])
def test_compress_writes_the_entries_eval_scores(evaluation, mini_transcript_path_module, smol, tmp_path, name):
    method = eval_method(name, str(mini_transcript_path_module))
    out = tmp_path / "c.safetensors"
    flags = ["--steps", str(STEPS)] if METHODS[name].recipe_class else []
    argv = ["compress", str(mini_transcript_path_module), "--model", "smollm2-135m", "--quant", "fp32"]
    assert (
        main(
            [
                *argv,
                "--device",
                "cpu",
                "--method",
                name,
                "--ratio",
                str(RATIO),
                "--span",
                "turns:3-4",
                *flags,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    torch.manual_seed(0)
    expected = evaluation.splice(method.compress(evaluation.work, RATIO if method.uses_ratio else 1.0))
    written = read_cache(out)
    assert written.meta.get("method", "vkv") == name
    assert len(written.segments) == len(expected.segments)
    for got, want in zip(written.segments, expected.segments):
        assert got.kind == want.kind and got.span == want.span
        assert torch.equal(got.positions.float(), want.positions.float().cpu()), name
        real = ...  # every slot, unless a bias marks some as padding (a file keeps the real entries only)
        if want.bias is not None:
            assert torch.equal(got.bias.float(), want.bias.float().cpu()), name
            real = torch.isfinite(want.bias.cpu())
        for field in ("keys", "values"):
            assert torch.equal(getattr(got, field).float()[real], getattr(want, field).float().cpu()[real]), (
                name,
                field,
            )


def test_compress_refuses_what_a_method_does_not_have(mini_transcript_path_module, tmp_path):
    out = tmp_path / "c.safetensors"
    argv = ["compress", str(mini_transcript_path_module), "--model", "smollm2-135m", "--span", "turns:3-4"]
    for flags in (
        ["--method", "kvzip", "--steps", "5"],
        ["--method", "kvopt", "--distill-probes", "summary"],  # kvopt's stage has distill_steps, not the probe choice
        ["--method", "reuse", "--per-turn"],
        ["--method", "snapkv", "--store", "embeddings"],
        ["--method", "knorm", "--bias", "nnls"],
        ["--method", "longcodezip"],
    ):
        assert main([*argv, *flags, "--out", str(out)]) == 2, flags
        assert not out.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["eval", "--method", "kvzip,am,snapkv,vkv"],
        ["eval", "--method", "kvzip"],
        ["compress", "--method", "am", "--out", "c.safetensors"],
    ],
)
def test_per_turn_reaches_every_method_given(mini_transcript_path_module, argv):
    """`--per-turn` is each method's own per-turn mode, never dropped: a method built from the command line runs per
    turn, vkv included."""
    command, *flags = argv
    args = build_parser().parse_args([command, str(mini_transcript_path_module), *flags, "--per-turn"])
    names = args.method if isinstance(args.method, (list, tuple)) else [args.method]
    classes = [method_class(name, args) for name in names]
    options = given_options(args, classes)
    for cls in classes:
        method = build_method(cls, recipe_from_args(args), args, options)
        assert method.per_turn
