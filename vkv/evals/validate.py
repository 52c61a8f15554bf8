"""`vkv validate`: a transcript's questions must be answerable only from the compressed turns."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from vkv.evals.metrics import containing_forms, contains_keyword, keyword_correct
from vkv.text.transcript import Transcript


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)  # fail validation
    warnings: list[str] = field(default_factory=list)  # worth a look, do not fail


def message_text(message) -> str:
    calls = " ".join(json.dumps({"name": c.name, "arguments": c.arguments}) for c in message.tool_calls)
    return f"{message.content} {calls}"


def leaks(transcript: Transcript, turns: tuple[int, int] | None = None) -> list[str]:
    """Questions whose answer the model can read without the compressed messages [turns) (default: all after the
    system message): an accepted keyword in a message kept verbatim, or in the question or its answer prefix. A
    score on such a question measures nothing, so `vkv eval` refuses them as `vkv validate` does."""
    where = transcript.path or transcript.id
    first, end = turns or transcript.default_span()
    outside = [(i, m) for i, m in enumerate(transcript.messages) if not first <= i < end]
    found = []
    for qi, q in enumerate(transcript.questions):
        at = f"{where}: questions[{qi}] ({q.id})"
        for keyword in q.accept:
            for i, m in outside:
                if contains_keyword(message_text(m), keyword, in_paths=True):
                    found.append(
                        f"{at}: accepted keyword '{keyword}' leaks into messages[{i}] ({m.role}), which is not compressed"
                    )
            if contains_keyword(q.question, keyword) or contains_keyword(q.answer_prefix, keyword):
                found.append(f"{at}: the question or answer prefix already contains '{keyword}'")
    return found


def check_static(transcript: Transcript) -> Findings:
    """Leakage and consistency checks that need no model."""
    found = Findings(problems=leaks(transcript))
    where = transcript.path or transcript.id
    first, end = transcript.default_span()
    for qi, q in enumerate(transcript.questions):
        at = f"{where}: questions[{qi}] ({q.id})"
        if q.choices and not keyword_correct(q.choices[0], q.accept, q.reject):
            found.problems.append(f"{at}: choices[0] '{q.choices[0]}' is not an accepted answer")
        for c in q.choices[1:]:
            if keyword_correct(c, q.accept, q.reject):
                found.problems.append(f"{at}: wrong choice '{c}' would be scored as correct")
        if not q.source_turns:
            found.warnings.append(f"{at}: no source_turns, so windowed evaluation cannot place it")
        elif not any(first <= t < end for t in q.source_turns):
            found.problems.append(f"{at}: source_turns {list(q.source_turns)} are all outside the compressed span")
        elif not any(
            contains_keyword(message_text(transcript.messages[t]), k, in_paths=True)
            for t in q.source_turns
            for k in q.accept
        ):
            forms = sorted(
                {
                    f
                    for t in q.source_turns
                    for k in q.accept
                    for f in containing_forms(message_text(transcript.messages[t]), k)
                }
            )
            hint = (
                (
                    f" (it appears only inside {', '.join(repr(f) for f in forms[:4])}: add the form that states the "
                    "answer to accept)"
                )
                if forms
                else ""
            )
            found.problems.append(f"{at}: no source turn states an accepted keyword{hint}")
    return found
