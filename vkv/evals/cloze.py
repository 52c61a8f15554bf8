"""Cloze recall: a question asked as "complete this line from the session", which a small model can answer.

Asked in its own words, the test model states an accepted keyword after only a few percent of questions even with
the whole context, so keyword accuracy says little about what a compressed context kept. Copying text it has seen is
what small models do well (induction heads): given the words that stood right before the keyword in the session, a
model that still holds them completes them with the keyword. So each question gets a cloze form, derived from the
transcript alone: its source turns' text cut just before an accepted keyword's last occurrence; the text before the
cut, at most `MAX_CHARS` characters of it in whole words, becomes the answer prefix after a request to quote the
line. A question counts for recall only where the full context completes its cloze correctly
(`recall_kept` in the runner): what the model can show with everything, kept by a method.

The cloze form is eval-side, like the question: no compressor ever sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vkv.evals.metrics import keyword_correct, keyword_starts, mean
from vkv.evals.validate import message_text
from vkv.text.transcript import Question, Transcript

# The request that precedes the cloze prefix; chosen on the long dev split among the wordings in
# scripts/cloze_counts.py (--wordings), where it gave the most full-context completions (evals/RESULTS.md).
REQUEST = "Quote that line from the session word for word."
# How much text before the keyword the prefix holds, and whether it may reach into earlier lines (chosen on the long
# dev split with the request: a longer prefix singles out its line among similar ones; 640 characters completed no
# more than 320, evals/RESULTS.md).
MAX_CHARS = 320
LINES = True


@dataclass(frozen=True)
class Cloze:
    """A question's cloze form: `prefix`, the text before the keyword's last occurrence (the answer begins with it),
    `request`, the user message asking for the line; or, where none could be derived, `why`."""

    prefix: str = ""
    request: str = ""
    why: str = ""

    @property
    def usable(self) -> bool:
        return not self.why


def cloze(question: Question, transcript: Transcript, max_chars: int = MAX_CHARS, lines: bool = LINES) -> Cloze:
    """The cloze form of `question`: the last occurrence of an accepted keyword, as a whole token, in its source
    turns' text (later turns first, within a message the last first) with text before it in its message, which is
    the prefix: at most `max_chars` characters, whole words, across line breaks with `lines`, else from its own line
    alone. What follows the keyword on its line does not matter: a completion counts only by its opening
    (`cloze_correct`), so a line that goes on to name a rejected value still asks for the keyword."""
    if not question.source_turns:
        return Cloze(why="no source turns")
    found_keyword = False
    for turn in sorted(set(question.source_turns), reverse=True):
        # tool calls are rendered by each chat template its own way; only the content appears verbatim
        text = transcript.messages[turn].content
        for start in reversed(_occurrences(text, question.accept)):
            found_keyword = True
            before = text[:start] if lines else text[:start].rsplit("\n", 1)[-1]
            prefix = _prefix(before, question.accept, max_chars)
            if prefix.strip():
                return Cloze(prefix, REQUEST)
    if found_keyword:
        return Cloze(why="the keyword opens every message it appears in")
    if any(keyword_correct(message_text(transcript.messages[t]), question.accept, ()) for t in question.source_turns):
        return Cloze(why="the keyword appears only in tool-call arguments")
    return Cloze(why="no accepted keyword in the source turns' text")


def _occurrences(text: str, accept: tuple[str, ...]) -> list[int]:
    """Start offsets in `text` of the accepted keywords where they match as a whole token (as answers are matched),
    in order."""
    return sorted({start for keyword in accept for start in keyword_starts(text, keyword)})


def _prefix(before: str, accept: tuple[str, ...], max_chars: int) -> str:
    """The end of `before`: at most `max_chars` characters starting at a word, without the one space before the
    keyword (a tokenizer writes it into the keyword's first token; more spaces, as in aligned columns, stay, or the
    completion would spend its tokens on them), and nothing at or before an accepted keyword, so the prefix never
    gives the answer away."""
    before = before.removesuffix(" ")
    tail = before[-max_chars:]
    if len(tail) < len(before) and not before[-max_chars - 1].isspace():
        tail = tail.split(None, 1)[1] if len(tail.split(None, 1)) > 1 else ""  # the cut fell inside a word
    lowered = tail.lower()
    cut = max(
        (lowered.rfind(k.strip().lower()) + len(k.strip()) for k in accept if k.strip().lower() in lowered), default=0
    )
    return tail[cut:].lstrip()


def cloze_correct(completion: str, question: Question) -> bool:
    """The completion goes on with an accepted keyword, as a whole token (leading spaces aside): the line copied.
    A keyword further on is no copy of the line (a model that restates its prompt would score), so only the
    completion's opening counts, and a rejected keyword there fails it as it fails an answer."""
    opening = completion.lstrip()
    return any(0 in keyword_starts(opening, k) for k in question.accept) and not any(
        0 in keyword_starts(opening, r) for r in question.reject
    )


def recall_summary(questions: list[dict[str, Any]]) -> dict[str, Any]:
    """`recall_kept`, the share of the questions counting for recall (the full context completes their cloze) whose
    cloze this run completes (None when none count), and `recall_questions`, how many count; nothing for records
    made without clozes (by the settings or before they existed), which say nothing about recall."""
    if not any("recall_counts" in q for q in questions):
        return {}
    counted = [q for q in questions if q.get("recall_counts")]
    return {"recall_kept": mean(float(q["cloze_correct"]) for q in counted), "recall_questions": len(counted)}
