"""The seam every text-level backend plugs into: text + query + budget → pruned text and a report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from vkv.errors import VkvError


@dataclass
class PruneResult:
    """Pruned text plus what was kept, measured in the scoring tokenizer's tokens."""

    text: str
    kept_lines: list[int]  # 0-based indices of original lines kept verbatim
    original_tokens: int
    compressed_tokens: int
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio_achieved(self) -> float:
        return self.original_tokens / max(self.compressed_tokens, 1)


class TextPruner(Protocol):
    name: str

    def prune(
        self,
        text: str,
        query: str,
        *,
        budget: int | None = None,
        ratio: float | None = None,
        language: str | None = None,
    ) -> PruneResult: ...


def token_budget(original_tokens: int, budget: int | None, ratio: float | None) -> int:
    """Resolve exactly one of an absolute token budget or a compression ratio ≥ 1 into a token budget."""
    if (budget is None) == (ratio is None):
        raise VkvError("give exactly one of a token budget or a compression ratio")
    if ratio is not None:
        if not ratio >= 1.0:
            raise VkvError(f"compression ratio must be at least 1, got {ratio}")
        return max(1, int(original_tokens / ratio))
    if budget < 1:
        raise VkvError(f"token budget must be at least 1, got {budget}")
    return budget
