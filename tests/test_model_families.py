"""The model families vkv supports, each as a tiny random model: the fast optimiser forward has the model's own loss
and gradients, and a compressed cache decodes through the plain model as vkv scores it. README's model table lists
these families."""

import copy

import pytest
import torch

import vkv
from tests.conftest import FIXTURES, build_tiny
from tests.test_optimize_speed import make_problem, reference_loss_and_grad
from tests.test_python_compress import answer_logprob
from vkv.compress.optimise import OptimConfig
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.methods import get_method
from vkv.text.transcript import load_transcript
from vkv.tools.optimizer_steps import vkv_loss_and_grad

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")


@pytest.mark.parametrize("arch", FAMILIES)
def test_the_fast_forward_is_the_models_own(arch, smol_tokenizer):
    lm = build_tiny(arch, smol_tokenizer)
    assert lm.fast_path_supported
    prefix, targets, positions = make_problem(lm, 7, 31, kind="kv-post-rope")
    embeddings = targets.pooled_embeddings + 0.05 * torch.randn(targets.pooled_embeddings.shape)
    loss, grad = vkv_loss_and_grad(lm, prefix, targets, positions, embeddings, OptimConfig(precision="fp32"))
    ref_loss, ref_grad = reference_loss_and_grad(lm, prefix, targets, positions, embeddings)
    torch.testing.assert_close(loss, ref_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_compressed_cache_answers_through_the_plain_model_as_vkv_scores_it(arch, smol_tokenizer):
    lm, transcript = build_tiny(arch, smol_tokenizer), load_transcript(FIXTURES / "mini-agent.json")
    evaluation = TranscriptEval(lm, transcript, settings=EvalSettings(max_new_tokens=1))
    expected = evaluation.evaluate(get_method("kvzip"), 4.0)
    cache = vkv.compress(lm.model, smol_tokenizer, transcript, method="kvzip", ratio=4.0)
    for pq, scored in zip(evaluation.questions, expected["questions"]):
        ours = answer_logprob(lm.model, copy.deepcopy(cache), pq.prompt, pq.choices[0])
        assert ours == pytest.approx(scored["answer_logprob"], abs=1e-4)
