"""The Python API refuses wrong types where the caller wrote them, in one sentence naming the field, instead of
failing later with an unrelated error (or returning nothing)."""

import pytest

import vkv
from vkv.errors import VkvError

MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Hash passwords with bcryptjs."},
    {"role": "assistant", "content": "Done: src/auth.js calls bcrypt.hash."},
]


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: vkv.OptimConfig(steps="2"), "field steps: expected int"),
        (lambda: vkv.CompressConfig(optim="fast"), "field optim: expected a config of type OptimConfig"),
        (lambda: vkv.Session(None), "field model: expected a model from vkv.load_model"),
    ],
)
def test_configs_and_sessions_refuse_wrong_types_when_built(build, field):
    with pytest.raises(VkvError, match=field):
        build()


def test_a_sessions_calls_refuse_wrong_arguments(tiny_llama, tmp_path):
    session = vkv.Session(tiny_llama)
    session.extend(MESSAGES)
    for call, field in (
        (lambda: session.ask(None), "field question: expected a non-empty string"),
        (lambda: session.ask("Which library?", max_new_tokens=-3), "field max_new_tokens"),
        (lambda: session.compress(turns="1-2", ratio=2.0), "field turns: expected \\(first, last\\)"),
        (lambda: session.save(tmp_path / "missing" / "s.safetensors"), "does not exist"),
    ):
        with pytest.raises(VkvError, match=field):
            call()
    assert not (tmp_path / "missing").exists()


def test_vkv_compress_refuses_wrong_turns_and_ratio(tiny_llama):
    model, tokenizer = tiny_llama.model, tiny_llama.tokenizer
    with pytest.raises(VkvError, match="field turns"):
        vkv.compress(model, tokenizer, MESSAGES, turns="1-2")
    with pytest.raises(VkvError, match="field ratio"):
        vkv.compress(model, tokenizer, MESSAGES, ratio="8")
