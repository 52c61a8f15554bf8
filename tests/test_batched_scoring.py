"""Questions scored side by side on one context (packed into one sequence of fed tokens) give what they give one
sequence at a time: the same log-probabilities and fidelity distributions (to 1e-4) and the same greedy answers, on
ragged, padded and full caches, with tokens fed before, prompts and choices of different lengths and answers that stop
at different steps."""

from __future__ import annotations

import random

import pytest
import torch

from tests.conftest import FIXTURES
from tests.test_ragged_cache import CACHE_NAMES, caches
from vkv.evals.metrics import kl_full_to_method
from vkv.evals.runner import EvalSettings, TranscriptEval
from vkv.kv.spliced import SplicedCache
from vkv.lm.context import Context, Scored
from vkv.methods import get_method
from vkv.text.transcript import load_transcript

TOLERANCE = 1e-4  # nats


def random_questions(seed: int = 0, count: int = 5) -> list[tuple[list[int], list[list[int]]]]:
    """Prompts of 1–8 tokens, each with 1–3 choices of 1–4 tokens (a one-token choice feeds nothing)."""
    rng = random.Random(seed)

    def ids(low: int, high: int) -> list[int]:
        return [rng.randrange(5, 1000) for _ in range(rng.randint(low, high))]

    return [(ids(1, 8), [ids(1, 4) for _ in range(rng.randint(1, 3))]) for _ in range(count)]


def assert_same(alone: list[Scored], batched: list[Scored]) -> None:
    assert len(alone) == len(batched)
    for one, other in zip(alone, batched):
        assert one.answer == other.answer
        assert len(one.logprobs) == len(other.logprobs)
        for a, b in zip(one.logprobs, other.logprobs):
            torch.testing.assert_close(b, a, atol=TOLERANCE, rtol=0)
        torch.testing.assert_close(other.fidelity, one.fidelity, atol=TOLERANCE, rtol=0)


def stopping_at_different_steps(lm, context: Context, questions, monkeypatch) -> None:
    """Make the stop token one that ends the answers at different steps (a random model rarely says its own), so
    that streams leave the batch at different steps."""
    monkeypatch.setattr(lm, "stop_token_ids", lambda: set())
    answers = [context.score_alone(p, c, 6).answer for p, c in questions]

    def lengths(token: int) -> set[int]:
        return {answer.index(token) if token in answer else len(answer) for answer in answers}

    stop = max({t for answer in answers for t in answer}, key=lambda t: len(lengths(t)))
    monkeypatch.setattr(lm, "stop_token_ids", lambda: {stop})


@pytest.mark.parametrize("name", CACHE_NAMES)
@pytest.mark.parametrize("fed", [[], [3, 4, 5]])
def test_side_by_side_scores_what_one_at_a_time_scores(tiny, name, fed, monkeypatch):
    context = Context(tiny, caches(tiny)[name])
    context.feed(fed)  # tokens fed before the questions: every stream sees them
    questions = random_questions()
    stopping_at_different_steps(tiny, context, questions, monkeypatch)
    alone = [context.score_alone(p, c, 6) for p, c in questions]
    assert len({len(s.answer) for s in alone}) > 1  # answers that stop at different steps
    nbytes, position = context.cache.nbytes, context.position
    assert_same(alone, context.score(questions, 6))
    assert context.length == len(fed) and context.position == position
    assert context.cache.nbytes == nbytes  # every stream's tokens are gone
    assert_same(alone[:1], context.score(questions[:1], 6))  # a batch of one


def test_streams_over_an_empty_cache_see_only_themselves(tiny):
    """Over a cache with no entries and nothing fed, each stream's first token attends to itself alone."""
    context = Context(tiny, SplicedCache())
    questions = random_questions(seed=1)
    alone = [context.score_alone(p, c, 3) for p, c in questions]
    batched = context.score(questions, 3)
    assert all(bool(torch.isfinite(s.fidelity).all()) for s in batched)
    assert_same(alone, batched)


def test_measure_in_batches_of_any_size_equals_one_at_a_time(tiny_llama):
    transcript = load_transcript(FIXTURES / "mini-agent.json")
    evaluation = TranscriptEval(tiny_llama, transcript, settings=EvalSettings(max_new_tokens=4, batch=1))
    spliced = evaluation.splice(get_method("kvzip").compress(evaluation.work, 4.0))
    alone, memory = evaluation.measure(spliced, alone=True)
    for batch in (1, 2):
        evaluation.settings.batch = batch
        batched, same_memory = evaluation.measure(spliced)
        assert same_memory == memory
        for one, other in zip(alone, batched):
            assert other.answer == one.answer
            assert other.choice_logprobs == pytest.approx(one.choice_logprobs, abs=TOLERANCE)
            torch.testing.assert_close(other.fidelity_logp, one.fidelity_logp, atol=TOLERANCE, rtol=0)
    evaluation.settings.batch = 0  # each question alone: the reference itself, number for number
    exact, _ = evaluation.measure(spliced)
    assert [(m.answer, m.choice_logprobs) for m in exact] == [(m.answer, m.choice_logprobs) for m in alone]
    assert all(torch.equal(m.fidelity_logp, a.fidelity_logp) for m, a in zip(exact, alone))


@pytest.fixture(scope="module")
def smol_evaluation(smol):
    transcript = load_transcript(FIXTURES / "mini-agent.json")
    return TranscriptEval(smol, transcript, settings=EvalSettings(max_new_tokens=12), allow_leaks=True)


@pytest.mark.parametrize("cache", ["full", "kvzip 8x", "kvzip 8x padded"])
def test_the_test_model_scores_the_same_side_by_side(smol, smol_evaluation, cache):
    evaluation = smol_evaluation
    if cache == "full":
        spliced = evaluation.splice(evaluation.work.keep(list(range(evaluation.end - evaluation.start))))
    else:
        spliced = evaluation.splice(get_method("kvzip").compress(evaluation.work, 8.0))
    context = Context(smol, spliced, padded=cache.endswith("padded"))
    questions = [(pq.prompt, pq.choices) for pq in evaluation.questions]
    assert len({len(p) for p, _ in questions}) > 1  # prompts of different lengths
    alone = [context.score_alone(p, c, 12) for p, c in questions]
    batched = context.score(questions, 12)
    assert_same(alone, batched)
    for full, one, other in zip(evaluation.full, alone, batched):
        kl = [kl_full_to_method(full.fidelity_logp, s.fidelity) for s in (one, other)]
        assert kl[1] == pytest.approx(kl[0], abs=TOLERANCE)
