"""`vkv.compress` on a plain transformers model: every KV method scores as `vkv eval` scores it, `model.generate()`
answers as vkv's own generate, a model that cannot read the cache raises, and a deep copy is a reusable cache."""

import copy
import inspect

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import vkv
from tests.conftest import FIXTURES, build_tiny
from vkv.api.compress import _kv_method
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.recipe import VkvRecipe
from vkv.errors import VkvError
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.methods import METHODS, get_method
from vkv.methods.base import TextMethod
from vkv.text.transcript import load_transcript, parse_transcript

FAST = CompressConfig(optim=OptimConfig(steps=2))
RATIO = 3.0


def cheap_options(name: str) -> dict:
    """Few optimisation steps for the methods that optimise (what tests/test_eval.py runs)."""
    cls = METHODS[name]
    if "recipe" not in cls.option_names():
        return {}
    return {"recipe": VkvRecipe(FAST) if cls.recipe_class is VkvRecipe else FAST}


def with_cache(model, cache) -> dict:
    """How this transformers version's forward takes a cache (`cache` from 5.24, `past_key_values` before)."""
    takes = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in takes else "past_key_values": cache}


def stock_tiny(tokenizer, attn: str = "sdpa"):
    """A fresh tiny llama with the weights of conftest's `tiny_llama`, its attention transformers' own."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        attn_implementation=attn,
        rope_theta=10000.0,
    )
    return AutoModelForCausalLM.from_config(config).float()


@pytest.fixture(scope="module")
def transcript():
    return load_transcript(FIXTURES / "mini-agent.json")


@pytest.fixture(scope="module")
def evaluation(tiny_llama, transcript):
    return TranscriptEval(tiny_llama, transcript, settings=EvalSettings(max_new_tokens=3))


def answer_logprob(model, cache, prompt: list[int], choice: list[int]) -> float:
    """log p(choice | context, prompt) from one plain forward over the prompt and the choice."""
    ids = torch.tensor([prompt + choice[:-1]])
    with torch.no_grad():
        logits = model(input_ids=ids, **with_cache(model, cache)).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 :], -1)
    return float(logp.gather(-1, torch.tensor(choice)[:, None]).sum())


VKV_MODES = {  # vkv's modes beside its default, each spelled as a user spells it in Python
    "vkv per turn": {"per_turn": True},
    "vkv verbatim shared": {"recipe": VkvRecipe(FAST, verbatim="shared")},
    "vkv per turn verbatim shared": {"per_turn": True, "recipe": VkvRecipe(FAST, verbatim="shared")},
}


@pytest.mark.parametrize("case", [*sorted(METHODS), *VKV_MODES])
def test_every_kv_method_scores_through_the_plain_model_as_vkv_eval_scores_it(evaluation, transcript, case):
    model, tokenizer = evaluation.lm.model, evaluation.lm.tokenizer
    name = case.split()[0]
    options = {**cheap_options(name), **VKV_MODES.get(case, {})}
    asked = {"method": name}
    if issubclass(METHODS[name], TextMethod):
        with pytest.raises(VkvError, match="prunes the messages' text.*kvzip"):
            vkv.compress(model, tokenizer, transcript, **asked, ratio=RATIO, **options)
        return
    cache = vkv.compress(model, tokenizer, transcript, **asked, ratio=RATIO, **options)
    assert isinstance(cache, vkv.RaggedCache)
    assert cache.get_seq_length() == len(evaluation.rendered.ids)  # the conversation's logical length
    expected = evaluation.evaluate(get_method(name, **options), RATIO)
    if name not in ("full", "none"):  # it holds the compressed entries only: less than the span's K/V in fp32
        layers, heads, dim = evaluation.lm.cache_shape
        full = (evaluation.end - evaluation.start) * layers * heads * 2 * dim * 4
        assert cache.span_nbytes(evaluation.start, evaluation.end) < full
    for pq, scored in zip(evaluation.questions, expected["questions"]):
        ours = answer_logprob(model, copy.deepcopy(cache), pq.prompt, pq.choices[0])
        assert ours == pytest.approx(scored["answer_logprob"], abs=1e-4)


def test_options_a_method_lacks_are_refused_naming_its_options(tiny_llama, transcript):
    with pytest.raises(
        VkvError, match="no option steps; its options are per_turn, every, cap, recent, mass, head_budget"
    ):
        vkv.compress(tiny_llama.model, tiny_llama.tokenizer, transcript, method="knorm", steps=3)
    with pytest.raises(VkvError, match="unknown method 'zip'; vkv.compress supports full, none"):
        vkv.compress(tiny_llama.model, tiny_llama.tokenizer, transcript, method="zip")


def test_vkv_modes_are_its_fields_and_the_earlier_mode_methods_are_refused(tiny_llama, transcript):
    per_turn = _kv_method("vkv", {"per_turn": True, "recipe": FAST})
    assert per_turn.name == "vkv" and per_turn.per_turn and per_turn.recipe == VkvRecipe(FAST)
    assert _kv_method("vkv", {"per_turn": False}).per_turn is False
    with pytest.raises(VkvError, match=r"^method 'sequential' was renamed: it is method 'vkv' with per_turn=True$"):
        vkv.compress(tiny_llama.model, tiny_llama.tokenizer, transcript, method="sequential")
    with pytest.raises(VkvError, match=r"^method 'hybrid' was renamed: it is method 'vkv' with verbatim='shared'$"):
        vkv.compress(tiny_llama.model, tiny_llama.tokenizer, transcript, method="hybrid")
    with pytest.raises(
        VkvError, match="method 'vkv' has no option steps; its options are per_turn, every, cap, recent, recipe"
    ):
        vkv.compress(tiny_llama.model, tiny_llama.tokenizer, transcript, method="vkv", steps=3)
    with pytest.raises(VkvError, match="field per_turn: expected bool, got 'yes'"):
        vkv.compress(tiny_llama.model, tiny_llama.tokenizer, transcript, method="vkv", per_turn="yes")
    with pytest.raises(
        VkvError, match=r"field keep_verbatim was renamed: .* recipe=vkv.VkvRecipe\(verbatim=\"shared\"\)"
    ):
        vkv.compress(tiny_llama.model, tiny_llama.tokenizer, transcript, method="vkv", keep_verbatim=True)


CONVERSATION = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Which library hashes the passwords in this project?"},
    {"role": "assistant", "content": "package.json lists bcryptjs 2.4.3, so the passwords are hashed with bcryptjs."},
    {"role": "user", "content": "And which runner do the tests use?"},
    {"role": "assistant", "content": "The tests run with vitest, configured in vitest.config.ts."},
]
QUESTION = {"role": "user", "content": "Remind me: which library hashes the passwords?"}


def test_plain_generate_answers_as_vkvs_own_generate(smol_tokenizer):
    model = stock_tiny(smol_tokenizer)  # transformers' attention until vkv.compress sets vkv's up
    cache = vkv.compress(model, smol_tokenizer, CONVERSATION, method="snapkv", ratio=RATIO)
    # what a transformers user writes: the whole conversation's ids, then the new ones, and the cache
    ids = smol_tokenizer.apply_chat_template(
        CONVERSATION + [QUESTION], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    out = model.generate(ids, **with_cache(model, cache), max_new_tokens=8, do_sample=False)
    theirs = out[0, ids.shape[1] :].tolist()
    # vkv's own path on the same compression
    lm = build_tiny("llama", smol_tokenizer)
    evaluation = TranscriptEval(lm, _with_question(CONVERSATION), settings=EvalSettings(max_new_tokens=3))
    spliced = evaluation.splice(get_method("snapkv").compress(evaluation.work, RATIO))
    prompt = ids[0, len(evaluation.rendered.ids) :]
    assert ids[0, : len(evaluation.rendered.ids)].tolist() == evaluation.rendered.ids
    ours = vkv.generate(lm, spliced, prompt, max_new_tokens=8, do_sample=False)[0].tolist()
    assert len(ours) > 0 and theirs[: len(ours)] == ours
    # and the compressed context is read: without it the answer's first token scores differently
    with torch.no_grad():
        first = model(input_ids=prompt[None], **with_cache(model, copy.deepcopy(cache))).logits[0, -1]
        alone = model(input_ids=prompt[None]).logits[0, -1]
    assert int(first.argmax()) == theirs[0] and not torch.allclose(first, alone, atol=1e-3)
    # the new ids alone: generate() would skip them all as cached; refused, naming what to pass
    with pytest.raises(VkvError, match="pass the whole conversation's ids"):
        model.generate(prompt[None], **with_cache(model, cache), max_new_tokens=2)


def _with_question(messages):
    """The conversation as a transcript with one question (what TranscriptEval asks for)."""
    questions = [{"id": "q", "question": QUESTION["content"], "accept": ["bcryptjs"]}]
    return parse_transcript({"id": "c", "messages": messages, "questions": questions})


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_model_whose_attention_cannot_read_the_cache_raises_naming_the_fix(tiny_llama, transcript, attn):
    cache = vkv.compress(tiny_llama.model, tiny_llama.tokenizer, transcript, method="knorm", ratio=RATIO)
    stock = stock_tiny(tiny_llama.tokenizer, attn)  # the same weights, transformers' own attention
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(VkvError, match=r"vkv.use_ragged_attention\(model\)"):
        stock(input_ids=ids, **with_cache(stock, copy.deepcopy(cache)))
    with pytest.raises(VkvError, match=r"vkv.use_ragged_attention\(model\)"):
        stock.generate(
            torch.tensor([[0] * cache.get_seq_length() + [1, 2]]), **with_cache(stock, cache), max_new_tokens=2
        )
    assert cache.appended == 0  # a refused call leaves the cache as it was
    vkv.use_ragged_attention(stock)  # the fix it names
    with torch.no_grad():
        reference = tiny_llama.model(input_ids=ids, **with_cache(stock, copy.deepcopy(cache))).logits
        fixed = stock(input_ids=ids, **with_cache(stock, cache)).logits
    torch.testing.assert_close(fixed, reference)


def test_a_deep_copy_is_a_reusable_cache(tiny_llama, transcript, evaluation):
    model, tokenizer = tiny_llama.model, tiny_llama.tokenizer
    cache = vkv.compress(model, tokenizer, transcript, method="snapkv", ratio=RATIO)
    (a, b) = [pq.prompt for pq in evaluation.questions]
    copies = [copy.deepcopy(cache), copy.deepcopy(cache)]
    with torch.no_grad():
        asked = [model(input_ids=torch.tensor([p]), **with_cache(model, c)).logits for p, c in zip((a, b), copies)]
        fresh = [
            model(
                input_ids=torch.tensor([p]),
                **with_cache(model, vkv.compress(model, tokenizer, transcript, method="snapkv", ratio=RATIO)),
            ).logits
            for p in (a, b)
        ]
    for ours, reference in zip(asked, fresh):
        torch.testing.assert_close(ours, reference)
    assert cache.appended == 0 and all(c.appended > 0 for c in copies)  # the original was never fed
