"""The one exception type a user can cause: the CLI prints its message as a single sentence; and how a refusal of a
text beyond the model's positions ends, which only the running command knows."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class VkvError(Exception):
    """Bad input or an unmet precondition, described in one sentence naming the file and field."""


# How a refusal of a text beyond the model's positions ends: what the running command lets its user do about it. Only
# the command knows whether it has a --window flag and whether one was given, so the command line sets this for each
# command (`too_long_remedy`); library calls get a sentence that names no flag.
TOO_LONG_REMEDY: ContextVar[str] = ContextVar(
    "too_long_remedy", default="pass fewer messages (vkv.text.windows cuts a transcript into windows that fit)"
)


@contextmanager
def too_long_remedy(remedy: str) -> Iterator[None]:
    """Within this block, refusals of texts beyond the model's positions end with `remedy`."""
    token = TOO_LONG_REMEDY.set(remedy)
    try:
        yield
    finally:
        TOO_LONG_REMEDY.reset(token)
