"""Cloze recall: a question asked as "complete this line from the session", which a small model can answer.

Asked in its own words, the test model states an accepted keyword after only a few percent of questions even with
the whole context, so keyword accuracy says little about what a compressed context kept. Copying text it has seen is
what small models do well (induction heads): given the words that stood right before the keyword in the session, a
model that still holds that line completes it with the keyword. So each question gets a cloze form, derived from the
transcript alone: the line of its source turns on which an accepted keyword last appears, cut just before the keyword;
the words before the cut, at most `MAX_WORDS` of them and `MAX_CHARS` characters, become the answer prefix of a
request to quote that line. A question counts for recall only where the full context completes its cloze correctly
(`recall_kept` in the runner): what the model can show with everything, kept by a method.

The cloze form is eval-side, like the question: no compressor ever sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

from vkv.evals.metrics import keyword_correct, keyword_starts
from vkv.evals.validate import message_text
from vkv.text.transcript import Question, Transcript

# The request that precedes the cloze prefix; chosen on the long dev split among the wordings in
# scripts/cloze_counts.py (--wordings), where it gave the most full-context completions (evals/RESULTS.md).
REQUEST = "Quote, word for word, the line from this session that begins with these words: {prefix}"
# The prefix is the end of the keyword's line: enough words to single the line out, few enough that the request
# stays a short lookup (longer prefixes gave no more full-context completions on the dev split).
MAX_WORDS = 8
MAX_CHARS = 60


@dataclass(frozen=True)
class Cloze:
    """A question's cloze form: `prefix`, the words before the keyword's last occurrence on its line (the answer
    begins with them), `request`, the user message asking for the line; or, where none could be derived, `why`."""

    prefix: str = ""
    request: str = ""
    why: str = ""

    @property
    def usable(self) -> bool:
        return not self.why


def cloze(question: Question, transcript: Transcript) -> Cloze:
    """The cloze form of `question`: the last occurrence of an accepted keyword in its source turns' text (later
    turns first, within a message the last line first) whose line, copied from the keyword on, would answer it
    (keyword_correct of the rest of the line), with the words before it on that line as the prefix."""
    if not question.source_turns:
        return Cloze(why="no source turns")
    found_keyword = False
    for turn in sorted(set(question.source_turns), reverse=True):
        message = transcript.messages[turn]
        # tool calls are rendered by each chat template its own way; only the content appears verbatim
        for line in reversed(message.content.splitlines()):
            for start in reversed(_occurrences(line, question.accept)):
                found_keyword = True
                if not keyword_correct(line[start:], question.accept, question.reject):
                    continue  # a perfect copy of the line would not count (a rejected value follows, or a joiner)
                prefix = _prefix(line[:start], question.accept)
                if prefix:
                    return Cloze(prefix, REQUEST.format(prefix=prefix))
    if found_keyword:
        return Cloze(why="no occurrence with words before it on its line that a copy of the line would answer")
    if any(keyword_correct(message_text(transcript.messages[t]), question.accept, ()) for t in question.source_turns):
        return Cloze(why="the keyword appears only in tool-call arguments")
    return Cloze(why="no accepted keyword in the source turns' text")


def _occurrences(line: str, accept: tuple[str, ...]) -> list[int]:
    """Start offsets in `line` of the accepted keywords where they match as a whole token (as answers are matched),
    in order."""
    return sorted({start for keyword in accept for start in keyword_starts(line, keyword)})


def _prefix(before: str, accept: tuple[str, ...]) -> str:
    """The last words of `before` (at most MAX_WORDS, MAX_CHARS characters, whole words), trailing spaces dropped
    (a tokenizer writes the space into the keyword's first token), and none at or before an accepted keyword, so the
    prefix never gives the answer away; "" when no word is left."""
    words = before.rstrip().split(" ")
    kept: list[str] = []
    for word in reversed(words):
        candidate = " ".join([word, *kept])
        if not word or len(kept) == MAX_WORDS or len(candidate) > MAX_CHARS:
            break
        if any(k.strip().lower() in word.lower() for k in accept):
            break
        kept.insert(0, word)
    return " ".join(kept).lstrip()


def cloze_correct(completion: str, question: Question) -> bool:
    """The completion goes on with an accepted keyword, as a whole token (leading spaces aside): the line copied.
    A keyword further on is no copy of the line (a model that restates its prompt would score), so only the
    completion's opening counts, and a rejected keyword there fails it as it fails an answer."""
    opening = completion.lstrip()
    return any(0 in keyword_starts(opening, k) for k in question.accept) and not any(
        0 in keyword_starts(opening, r) for r in question.reject
    )
