"""The long split (transcripts/long/): sessions as long as the test model's positions allow, whose questions mostly
need evidence stated thousands of tokens before the end."""

from collections import Counter

import pytest

from tests.conftest import ROOT
from vkv.evals.metrics import contains_keyword
from vkv.evals.validate import check_static, message_text
from vkv.text.transcript import load_transcript, render

LONG = sorted((ROOT / "transcripts" / "long").glob("*/*.json"))
FAR = 2048  # tokens between a question's latest evidence and the end that make it a long-range question


def test_the_long_split_has_its_transcripts():
    splits = Counter(path.parent.name for path in LONG)
    assert splits["test"] >= 12 and splits["dev"] >= 4


@pytest.mark.parametrize("path", LONG, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_long_transcript_fits_the_model_and_asks_mostly_about_the_far_past(path, smol_tokenizer):
    transcript = load_transcript(path)
    assert check_static(transcript).problems == []
    rendered = render(transcript, smol_tokenizer)
    assert 5_500 <= len(rendered.ids) <= 7_400  # a whole session and a question fit the 8,192 positions
    assert len(transcript.questions) >= 10
    assert {q.kind for q in transcript.questions} == {"decision", "tool_output", "change"}
    span = transcript.default_span()
    distances = [rendered.evidence_distance(q.source_turns, span)[0] for q in transcript.questions]
    assert None not in distances
    assert sum(d >= FAR for d in distances) >= 0.4 * len(distances)
    stale_far = [q for q in transcript.questions if q.kind == "change" and stale_gap(transcript, rendered, q) >= FAR]
    assert stale_far  # a change whose stale value was stated thousands of tokens before the final one


def stale_gap(transcript, rendered, question) -> int:
    """Tokens between the first statement of a stale value (a `reject` keyword) and the first statement of the
    final one; −1 when no stale value is stated before it."""
    texts = [message_text(m) for m in transcript.messages]
    first_final = min(question.source_turns)
    stale = [
        t for t in range(first_final) if any(contains_keyword(texts[t], k, in_paths=True) for k in question.reject)
    ]
    return rendered.spans[first_final].start - rendered.spans[min(stale)].end if stale else -1
