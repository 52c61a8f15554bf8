"""SegmentGroup: several segments that together stand for one span, with how they were made.

Sequential compression turns a span of messages into one segment per message; a method returns them as a
group, and whoever splices them appends each in order. It is a list, so code that splices lists needs no
special case, and it carries `stats` like a single segment does.
"""

from __future__ import annotations

from typing import Any, Iterable

from .cache import Segment


class SegmentGroup(list):
    """Segments in span order (non-overlapping), plus stats describing the whole group."""

    def __init__(self, segments: Iterable[Segment] = (), stats: dict[str, Any] | None = None):
        super().__init__(segments)
        self.stats: dict[str, Any] = stats or {}

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self)

    @property
    def original_tokens(self) -> int:
        return sum(s.original_tokens for s in self)
