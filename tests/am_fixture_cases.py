"""The attention-matching variants whose float64 row-by-row results tests/test_am_batched.py holds the batched fit
to (written by scripts/am_fixture.py), and the work they compact: the tiny random llama's mini-agent span."""

from __future__ import annotations

from transformers import AutoTokenizer

from tests.conftest import FIXTURES, build_tiny
from vkv.evals.runner import TranscriptEval
from vkv.lm.zoo import model_path
from vkv.text.transcript import load_transcript

CASES = {
    "default": {},  # on-policy repeat queries, RMS keys, bounded NNLS β, refitted values, one global budget
    "off-policy-uniform": {"on_policy": False, "head_budget": "uniform"},
    "omp-adaptive": {"selection": "omp", "head_budget": "adaptive", "on_policy": False},
    "fit-shared-ridge": {"bias": "fit", "head_budget": "shared", "ridge": 0.1, "queries": "repeat+span"},
}


def tiny_work(tokenizer=None):
    tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_path("smollm2-135m"))
    lm = build_tiny("llama", tokenizer)
    return TranscriptEval(lm, load_transcript(FIXTURES / "mini-agent.json")).work
