"""Cut a long transcript into turn-aligned windows that fit a token budget, each with its own questions.

A window keeps the leading system message plus consecutive turns; the questions it carries are those whose
answer is first stated in one of its turns, so each question is asked in exactly one window (a later recap
that repeats every fact does not pull all questions into its window). Turns outside a window are not in its
context at all.
"""

from __future__ import annotations

from dataclasses import replace

from vkv.errors import VkvError
from vkv.text.transcript import Rendered, Transcript


def turn_windows(transcript: Transcript, rendered: Rendered, max_tokens: int) -> list[tuple[int, int]]:
    """Consecutive turn ranges [first, last) after the system message, each ≤ max_tokens where possible
    (a single longer message is a window of its own)."""
    if max_tokens < 1:
        raise VkvError(f"--window must be a positive number of tokens, got {max_tokens}")
    first_turn, end_turn = transcript.default_span()
    windows: list[tuple[int, int]] = []
    start, used = first_turn, 0
    for turn in range(first_turn, end_turn):
        length = rendered.spans[turn].length
        if used and used + length > max_tokens:
            windows.append((start, turn))
            start, used = turn, 0
        used += length
    windows.append((start, end_turn))
    return windows


def window_transcript(transcript: Transcript, first: int, last: int) -> Transcript:
    """The system message plus turns [first, last), with the questions first answered there (turns renumbered)."""
    keep_system = transcript.messages and transcript.messages[0].role == "system"
    head = (transcript.messages[0],) if keep_system else ()
    offset = first - len(head)
    questions = tuple(
        replace(q, source_turns=tuple(t - offset for t in q.source_turns if first <= t < last))
        for q in transcript.questions
        if q.source_turns and first <= min(q.source_turns) < last
    )
    return replace(
        transcript,
        id=f"{transcript.id}@turns{first}-{last - 1}",
        messages=head + transcript.messages[first:last],
        questions=questions,
        window=(first, last),
    )


def select_windows(transcript: Transcript, rendered: Rendered, max_tokens: int, limit: int | None = None):
    """Windows that carry questions, most questions first (ties: earlier first), at most `limit` of them."""
    subs = [window_transcript(transcript, a, b) for a, b in turn_windows(transcript, rendered, max_tokens)]
    ranked = sorted((s for s in subs if s.questions), key=lambda s: -len(s.questions))
    chosen = ranked[:limit] if limit else ranked
    order = {id(s): i for i, s in enumerate(subs)}
    return sorted(chosen, key=lambda s: order[id(s)])
