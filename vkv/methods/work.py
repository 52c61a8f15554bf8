"""What a text-level method is given: the span's messages and the conversation's latest request, never an
evaluation question."""

from __future__ import annotations

from dataclasses import dataclass

from vkv.lm.frozen import FrozenLM


@dataclass
class TextWork:
    """What a text-level method may use: the span's messages and a question-agnostic query."""

    lm: FrozenLM
    messages: list  # the span's Message objects, in order
    query: str  # the conversation's most recent user request, never an evaluation question
