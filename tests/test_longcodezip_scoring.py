"""Model-side scoring on a tiny random Llama with the real SmolLM2 tokenizer: AMI and line NLLs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vkv.backends.longcodezip.scoring import (
    Scorer,
    ami_scores,
    line_nll_from_tokens,
    line_nll_one_pass,
    line_nll_per_line_passes,
    token_nll_one_pass,
)
from vkv.backends.longcodezip.tokens import count_tokens, encode, tokenize_lines
from vkv.errors import VkvError
from vkv.lm.frozen import FrozenLM

FUNCTION = '''\
def merge(left, right):
    """Merge two sorted lists."""
    out = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            out.append(left[i])
            i += 1

        else:
            out.append(right[j])
            j += 1
    return out + left[i:] + right[j:]
'''


@pytest.fixture(scope="module")
def tiny_lm(tiny_llama) -> FrozenLM:
    """conftest's tiny random Llama with the real SmolLM2 tokenizer: fast, and scores are noise."""
    return tiny_llama


def lines_of(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def test_tokens_belong_to_the_line_they_end_in(tiny_lm):
    lines = lines_of(FUNCTION)
    tokenized = tokenize_lines(tiny_lm.tokenizer, lines)
    assert tokenized.tokens_per_line().sum() == len(tokenized.ids) == count_tokens(tiny_lm.tokenizer, FUNCTION)
    decoded = [tiny_lm.tokenizer.decode([i]) for i in tokenized.ids]
    for token, line in zip(decoded, tokenized.line_of_token):
        if token.startswith("\n") and token.strip("\n"):  # "\n    ": the newline plus the next indentation
            assert lines[line].startswith(token.lstrip("\n"))


def test_one_pass_line_nll_equals_one_pass_per_line(tiny_lm):
    tokenized = tokenize_lines(tiny_lm.tokenizer, lines_of(FUNCTION))
    single, per_line = Scorer(tiny_lm), Scorer(tiny_lm)
    fast = line_nll_one_pass(single, tokenized)
    slow = line_nll_per_line_passes(per_line, tokenized)
    assert np.array_equal(np.isnan(fast), np.isnan(slow))
    np.testing.assert_allclose(fast[~np.isnan(fast)], slow[~np.isnan(slow)], atol=1e-4)
    assert single.meter.calls == 1 and single.meter.tokens == len(tokenized.ids) + 1
    scored_lines = int((tokenized.tokens_per_line() > 0).sum())
    assert per_line.meter.calls == scored_lines
    assert per_line.meter.tokens > 5 * single.meter.tokens  # quadratic vs linear, even on 13 lines


def test_batched_ami_equals_one_at_a_time_and_reuses_context_scores(tiny_lm):
    tok = tiny_lm.tokenizer
    contexts = [encode(tok, t) for t in (FUNCTION, "x = 1\n", "import os\nprint(os.getcwd())\n", "")]
    query = encode(tok, "How are two sorted lists merged?")
    separator = encode(tok, "\n\n")
    batched = ami_scores(Scorer(tiny_lm, batch_size=16), contexts, query, separator, keep_context_nll=True)
    single = ami_scores(Scorer(tiny_lm, batch_size=1), contexts, query, separator, keep_context_nll=False)
    np.testing.assert_allclose(batched.scores, single.scores, atol=1e-4)
    assert batched.query_nll == pytest.approx(single.query_nll, abs=1e-4)
    assert batched.scores[-1] == pytest.approx(0.0, abs=1e-5)  # an empty context changes nothing
    # The coarse pass's context scores are the fine stage's token scores: same numbers, no extra pass.
    alone = token_nll_one_pass(Scorer(tiny_lm), contexts[0])
    np.testing.assert_allclose(batched.context_nll[0], alone, atol=1e-4)
    tokenized = tokenize_lines(tok, lines_of(FUNCTION))
    np.testing.assert_allclose(
        line_nll_from_tokens(batched.context_nll[0], tokenized), line_nll_one_pass(Scorer(tiny_lm), tokenized)
    )


def test_ami_is_in_bits_per_query_token(tiny_lm):
    tok = tiny_lm.tokenizer
    scorer = Scorer(tiny_lm)
    query = encode(tok, "merge sorted lists")
    result = ami_scores(scorer, [encode(tok, FUNCTION)], query, encode(tok, "\n\n"), keep_context_nll=False)
    ids = [scorer.start] + encode(tok, "\n\n") + query
    with torch.no_grad():
        logits = tiny_lm.model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    expected = float(-logp[-len(query) :].mean() / np.log(2))
    assert result.query_nll == pytest.approx(expected, abs=1e-4)


def test_empty_or_oversized_query_is_a_clear_error(tiny_lm):
    scorer = Scorer(tiny_lm, max_tokens=64)
    with pytest.raises(VkvError, match="query is empty"):
        ami_scores(scorer, [[5]], [], [], keep_context_nll=False)
    with pytest.raises(VkvError, match="too long for the scoring window"):
        ami_scores(scorer, [[5]], [7] * 100, [], keep_context_nll=False)
