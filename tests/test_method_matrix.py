"""Every KV method crossed with the options it declares (per turn, head budget, mass) at ratios 3.2 and 16, on the
tiny random model: each combination compresses, decodes one question and survives a cache file (at 16× the per-head
hybrids meet turns of one entry per head, which keep that entry verbatim). The table is derived from the registry and
the methods' declared settings, on the method or in its recipe, so a new method or a new choice joins it with no edit
here.

The dtype axis: every method, whole and per turn, in the dtypes users run (bf16, fp16, and 8-bit weights with fp16
activations, as bitsandbytes loads them on CUDA) on the same tiny model, through the same checks; the other options
change which entries are kept, not the precision they are computed in, so they are crossed in fp32 only."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tests.conftest import FIXTURES, build_tiny
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.file import save_cache
from vkv.lm.context import Context
from vkv.lm.frozen import FrozenLM
from vkv.lm.rebuild import load_cache
from vkv.methods import METHODS
from vkv.methods.base import TextMethod
from vkv.methods.eviction import MASS_RULES
from vkv.settings import Setting, flat_settings, from_flat
from vkv.text.transcript import load_transcript

OPTIONS = ("per_turn", "head_budget", "mass", "verbatim")  # crossed, each over every value it declares
RATIOS = (3.2, 16.0)
# optimisers take one step where they are on by default (a stage off by default stays off): the matrix checks
# plumbing, not quality
FEWEST_STEPS = {"steps": 1, "adam_steps": 1, "distill_steps": 1}


def kv_methods() -> list[str]:
    """The registry's methods that produce K/V entries (text methods and the once-measured references aside)."""
    return [name for name, cls in METHODS.items() if not cls.reference and not issubclass(cls, TextMethod)]


def declared(name: str) -> tuple[dict[str, Setting], dict[str, Setting]]:
    """The method's own settings and its recipe's (flat keys), each by key."""
    cls = METHODS[name]
    own = {s.key: s for s in flat_settings(cls)}
    recipe = {s.key: s for s in flat_settings(cls.recipe_class)} if cls.recipe_class is not None else {}
    return own, recipe


def choices(setting: Setting) -> tuple:
    return (False, True) if isinstance(setting.default, bool) else setting.allowed()


def combinations() -> list:
    """One case per method, product of the values of the options it declares, and ratio; a product the method's own
    check refuses before any work (vkv's per-head verbatim beside a shared head budget) is no case."""
    cases = []
    for name in kv_methods():
        own, recipe = declared(name)
        axes = [(key, choices(own.get(key) or recipe[key])) for key in OPTIONS if key in own or key in recipe]
        for values in itertools.product(*(v for _, v in axes)):
            options = dict(zip((k for k, _ in axes), values))
            if not accepted(name, options):
                continue
            for ratio in RATIOS:
                cases.append(pytest.param(name, options, ratio, id=case_id(name, options, ratio)))
    return cases


def accepted(name: str, options: dict[str, object]) -> bool:
    try:  # vkv resolves its recipe as it is built; the others check their options there too
        method = build(name, options)
        method.settings() if hasattr(method, "settings") else method.check()
    except VkvError:
        return False
    return True


def case_id(name: str, options: dict[str, object], ratio: float) -> str:
    """E.g. `kvzip-global-16`, `knorm-per-turn-adaptive-mass-nearest-3.2`: switches off and no mass are left out."""
    words = [name]
    if options.get("per_turn"):
        words.append("per-turn")
    if "head_budget" in options:
        words.append(str(options["head_budget"]))
    if options.get("mass", "none") != "none":
        words.append(f"mass-{options['mass']}")
    if options.get("verbatim"):
        words.append(f"verbatim-{options['verbatim']}")
    return "-".join([*words, f"{ratio:g}"])


def build(name: str, options: dict[str, object]):
    """The method with `options` and the fewest optimiser steps, each set where it is declared: on the method, or in
    its recipe (through the recipe's flat keys, so nested settings such as sequential's need no special case)."""
    own, recipe = declared(name)
    on = {k: v for k, v in FEWEST_STEPS.items() if (own.get(k) or recipe.get(k)) and (own.get(k) or recipe[k]).default}
    wanted = on | options
    kwargs = {k: v for k, v in wanted.items() if k in own}
    flat = {k: v for k, v in wanted.items() if k in recipe and k not in kwargs}
    if flat:
        kwargs["recipe"] = from_flat(METHODS[name].recipe_class, flat)
    return METHODS[name](**kwargs)


def test_the_matrix_reaches_each_option_on_the_method_or_in_its_recipe():
    axes = {name: [p.values[1] for p in combinations() if p.values[0] == name] for name in kv_methods()}
    assert {"vkv", "kvzip", "snapkv", "am"} <= set(axes)
    assert {o["head_budget"] for o in axes["vkv"]} == {"shared", "uniform", "adaptive", "global"}  # nested
    assert {(o["per_turn"], o["verbatim"]) for o in axes["vkv"]} == set(
        itertools.product((False, True), ("none", "per-head", "shared", "shared+per-head"))
    )  # vkv's modes are its fields, crossed as every option is
    refused = {(o["head_budget"], o["verbatim"]) for o in axes["vkv"]}
    assert not {("shared", "per-head"), ("shared", "shared+per-head")} & refused  # no per-head share to keep
    assert {(o["per_turn"], o["mass"]) for o in axes["kvzip"]} == set(itertools.product((False, True), MASS_RULES))
    assert build("vkv", {"head_budget": "global", "per_turn": True}).settings().compress.optim.steps == 1


def transcript_eval(lm: FrozenLM) -> TranscriptEval:
    return TranscriptEval(lm, load_transcript(FIXTURES / "mini-agent.json"), settings=EvalSettings(max_new_tokens=1))


@pytest.fixture(scope="module")
def evaluation(tiny_llama):
    return transcript_eval(tiny_llama)


DTYPES = ("bf16", "fp16", "8bit")


def tiny_in(dtype: str, tokenizer, root) -> FrozenLM:
    """The matrix's tiny model in `dtype`: cast, or (8bit) saved and loaded through bitsandbytes with fp16 for the
    layers it leaves unquantised, as `load_model` loads 8-bit weights on CUDA."""
    lm = build_tiny("llama", tokenizer)
    if dtype != "8bit":
        model = lm.model.to({"bf16": torch.bfloat16, "fp16": torch.float16}[dtype])
        return FrozenLM(model, tokenizer, name=f"tiny-llama-{dtype}", quant=dtype, device=torch.device("cpu"))
    pytest.importorskip("bitsandbytes")
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    lm.model.save_pretrained(root)
    model = AutoModelForCausalLM.from_pretrained(
        root, quantization_config=BitsAndBytesConfig(load_in_8bit=True), dtype=torch.float16, device_map={"": "cpu"}
    )
    return FrozenLM(model, tokenizer, name="tiny-llama-8bit", quant="8bit", device=torch.device("cpu"))


@pytest.fixture(scope="module", params=DTYPES)
def evaluation_in(request, smol_tokenizer, tmp_path_factory):
    return transcript_eval(tiny_in(request.param, smol_tokenizer, tmp_path_factory.mktemp("tiny-8bit")))


def dtype_combinations() -> list:
    """Each KV method with its options at their defaults, whole and (where it has the mode) per turn, at 8x."""
    cases = []
    for name in kv_methods():
        own, recipe = declared(name)
        for per_turn in (False, True) if "per_turn" in own or "per_turn" in recipe else (False,):
            options = {"per_turn": True} if per_turn else {}
            cases.append(pytest.param(name, options, 8.0, id=case_id(name, options, 8.0)))
    return cases


@pytest.mark.filterwarnings("ignore::vkv.compress.hybrid.ShortTurnWarning")  # expected at 16x on short turns
@pytest.mark.parametrize("name, options, ratio", combinations())
def test_each_method_and_option_compresses_decodes_and_saves(evaluation, tmp_path, name, options, ratio):
    compresses_decodes_and_saves(evaluation, tmp_path, name, options, ratio)


@pytest.mark.filterwarnings("ignore::vkv.compress.hybrid.ShortTurnWarning")
@pytest.mark.parametrize("name, options, ratio", dtype_combinations())
def test_each_method_runs_in_every_dtype_users_have(evaluation_in, tmp_path, name, options, ratio):
    compresses_decodes_and_saves(evaluation_in, tmp_path, name, options, ratio)


def compresses_decodes_and_saves(evaluation: TranscriptEval, tmp_path, name: str, options: dict, ratio: float):
    work, method = evaluation.work, build(name, options)
    torch.manual_seed(0)
    segment = method.compress(work, ratio)
    spliced = evaluation.splice(segment)
    entries = spliced.span_entries(evaluation.start, evaluation.end)
    assert 0 < entries <= work.span_length
    (measured,), _ = evaluation.measure(spliced, evaluation.questions[:1])
    assert all(math.isfinite(lp) for lp in measured.choice_logprobs)
    spliced.meta.update({"fingerprint": work.lm.fingerprint, "spec": work.lm.spec.to_dict()})
    save_cache(spliced, tmp_path / "c.safetensors")
    loaded = load_cache(tmp_path / "c.safetensors", work.lm)
    assert loaded.span_entries(evaluation.start, evaluation.end) == pytest.approx(entries)
    probe = evaluation.questions[0].prompt
    assert torch.equal(Context(work.lm, loaded).feed(probe), Context(work.lm, spliced).feed(probe))
