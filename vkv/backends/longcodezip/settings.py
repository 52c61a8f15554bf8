"""The backend's knobs, with the paper's defaults where the paper has one."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from vkv.errors import VkvError


@dataclass(frozen=True)
class LongCodeZipSettings:
    alpha: float = 0.5  # spike threshold, in standard deviations of the line-NLL differences
    beta: float = 0.5  # bias of the adaptive retention ratio towards high-AMI chunks (paper: 0.5)
    fine_keep: float = 0.5  # share of coarse-selected tokens the fine stage keeps on average
    rank_only: bool = False  # coarse stage only: whole chunks, no line pruning
    min_fine_lines: int = 5  # chunks shorter than this are kept whole (paper: 5)
    max_chunk_tokens: int = 512  # a class larger than this is split into its members
    max_score_tokens: int = 4096  # scoring window; longer contexts are scored on their beginning
    batch_tokens: int = 8192  # padded tokens per forward pass
    batch_size: int = 16
    knapsack_resolution: int = 4096  # DP cells; larger budgets bucket the token weights
    separator: str = "\n\n"  # between a context and the query when scoring AMI
    max_attempts: int = 12  # render-measure-shrink rounds before falling back to a bare placeholder

    def __post_init__(self) -> None:
        checks = {
            "alpha": self.alpha >= 0,
            "beta": 0 <= self.beta <= 1,
            "fine_keep": 0 < self.fine_keep <= 1,
            "min_fine_lines": self.min_fine_lines >= 1,
            "max_chunk_tokens": self.max_chunk_tokens >= 1,
            "max_score_tokens": self.max_score_tokens >= 16,
            "batch_tokens": self.batch_tokens >= 1,
            "batch_size": self.batch_size >= 1,
            "knapsack_resolution": self.knapsack_resolution >= 16,
            "max_attempts": self.max_attempts >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise VkvError(f"longcodezip setting '{name}' has an invalid value {getattr(self, name)!r}")

    def as_dict(self) -> dict:
        return asdict(self)
