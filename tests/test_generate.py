"""`generate()` on a spliced cache: transformers' own decoding at the cache's logical positions, with its biases."""

import pytest
import torch
from transformers import TextStreamer

from tests.conftest import FIXTURES
from vkv.compress.config import CompressConfig
from vkv.compress.optimise import OptimConfig
from vkv.compress.span import compress_span
from vkv.errors import VkvError
from vkv.lm.context import Context
from vkv.lm.generate import generate
from vkv.text.transcript import load_transcript, render


@pytest.fixture(scope="module")
def caches(tiny_llama):
    """A virtual-token cache with proportional-attention biases and one without biases, both ending before the
    last message, whose tokens serve as the prompt."""
    rendered = render(load_transcript(FIXTURES / "mini-agent.json"), tiny_llama.tokenizer)
    start, end = rendered.spans[1].start, rendered.spans[4].start
    cut = rendered.spans[5].start
    ids = rendered.ids[:cut]
    out = {}
    for biased in (True, False):
        shares = "adaptive" if biased else "shared"  # unbiased: no mass and no head-wise masks either
        config = CompressConfig(proportional_attention=biased, head_budget=shares, optim=OptimConfig(steps=2))
        out[biased] = compress_span(tiny_llama, ids, start, end, 4.0, config)
    return out, rendered.ids[cut : cut + 12]


@pytest.mark.parametrize("biased", [True, False])
def test_greedy_generate_matches_vkvs_own_greedy_loop(tiny_llama, caches, biased):
    spliced = caches[0][biased]
    prompt = caches[1]
    assert spliced.next_position > spliced.physical_length  # logical and physical positions differ
    assert (spliced.attention_bias() is not None) == biased
    ours = Context(tiny_llama, spliced).greedy(prompt, max_new_tokens=8)
    out = generate(
        tiny_llama, spliced, prompt, max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    theirs = out.sequences[0].tolist()
    assert theirs[: len(ours)] == ours and len(theirs) >= len(ours)
    # the first step's logits equal those of vkv's decoding Context, which places and biases entries explicitly
    context = Context(tiny_llama, spliced)
    torch.testing.assert_close(out.logits[0][0].float(), context.feed(prompt)[-1], atol=1e-4, rtol=1e-4)
    follow = context.feed([theirs[0]])[-1]
    torch.testing.assert_close(out.logits[1][0].float(), follow, atol=1e-4, rtol=1e-4)


def test_sampling_with_a_seed_is_reproducible_and_streams(tiny_llama, caches, capsys):
    spliced, prompt = caches[0][True], caches[1]
    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(generate(tiny_llama, spliced, prompt, max_new_tokens=6, do_sample=True, temperature=1.0))
    assert torch.equal(runs[0], runs[1])
    generate(
        tiny_llama, spliced, prompt, max_new_tokens=4, do_sample=False, streamer=TextStreamer(tiny_llama.tokenizer)
    )
    assert capsys.readouterr().out.strip()  # the streamer printed the decoded prompt and answer


def test_the_hooks_are_gone_afterwards(tiny_llama, caches):
    modules = tiny_llama.attention_modules() + [tiny_llama.model.model.rotary_emb]
    generate(tiny_llama, caches[0][True], caches[1], max_new_tokens=2, do_sample=False)
    assert all(not m._forward_pre_hooks for m in modules)


def test_a_cache_from_another_model_is_refused(tiny_llama, caches):
    spliced = caches[0][True]
    spliced.meta["fingerprint"], spliced.meta["model"] = "0" * 16, "other-model"
    try:
        with pytest.raises(VkvError, match="fingerprint: the cache was built for model 'other-model'"):
            generate(tiny_llama, spliced, caches[1], max_new_tokens=2)
    finally:
        spliced.meta.pop("fingerprint"), spliced.meta.pop("model")


@pytest.mark.integration
def test_generate_on_a_loaded_cache_file_matches_vkv_ask(smol, tmp_path):
    from vkv.compress.span import compress_transcript
    from vkv.kv.file import save_cache
    from vkv.lm.rebuild import load_cache
    from vkv.text.transcript import followup

    transcript = load_transcript(FIXTURES / "mini-agent.json")
    config = CompressConfig(optim=OptimConfig(steps=3))
    save_cache(compress_transcript(smol, transcript, (1, 4), 3.0, config), tmp_path / "c.safetensors")
    spliced = load_cache(tmp_path / "c.safetensors", smol)
    prompt, _ = followup(smol.tokenizer, render(transcript, smol.tokenizer), transcript, "Which test runner is used?")
    ours = Context(smol, spliced).greedy(prompt, max_new_tokens=12)  # what `vkv ask` answers
    theirs = generate(smol, spliced, prompt, max_new_tokens=12, do_sample=False)[0].tolist()
    assert theirs == ours or (theirs[: len(ours)] == ours and theirs[len(ours)] in smol.stop_token_ids())
