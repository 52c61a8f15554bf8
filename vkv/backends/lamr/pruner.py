"""`LaMR`: the learned code pruner behind vkv's text-backend seam.

Without a budget it does what the paper does: keep lines whose Viterbi keep fraction is ≥ the threshold
(0.4), then AST-aware repair. With a token budget (or ratio) it ranks lines by posterior keep probability
and keeps the largest prefix of that ranking whose repaired, rendered output fits, placeholders included;
the achieved size is measured by tokenising the output with the backbone's tokenizer.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from pathlib import Path

from vkv.backends.base import PruneResult, token_budget
from vkv.backends.lamr.checkpoint import CONFIG_FILE, SWE_PRUNER_HUB_ID, load_checkpoint, load_swe_pruner
from vkv.backends.lamr.inference import LineScores, score_lines, select_lines
from vkv.backends.lamr.model import DEFAULT_BACKBONE, LaMRModel
from vkv.backends.lamr.repair import RepairConfig, Repaired, render_selection, repair
from vkv.backends.source.lines import split_lines
from vkv.errors import VkvError
from vkv.lm.load import resolve_device


@dataclass
class _Selection:
    repaired: Repaired
    tokens: int


class LaMR:
    name = "lamr"

    def __init__(
        self,
        model: LaMRModel,
        threshold: float | None = None,
        repair: bool = True,
        repair_config: RepairConfig = RepairConfig(),
        batch_size: int = 4,
    ):
        self.model = model.eval()
        self.threshold = model.config.threshold if threshold is None else float(threshold)
        if not 0.0 <= self.threshold <= 1.0:
            raise VkvError(f"threshold must be in [0, 1], got {self.threshold}")
        self.repair = repair
        self.repair_config = repair_config
        self.batch_size = batch_size

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: str | Path,
        device: str | None = None,
        threshold: float | None = None,
        repair: bool = True,
        backbone: str | None = None,
    ) -> LaMR:
        """A vkv LaMR checkpoint directory, or SWE-Pruner weights (their model.safetensors, its directory,
        or the hub id ayanami-kitasan/code-pruner); `backbone` overrides where the backbone is read from
        (for SWE-Pruner: its architecture and tokenizer, default Qwen/Qwen3-Reranker-0.6B)."""
        path = Path(checkpoint).expanduser()
        ours = (path / CONFIG_FILE).is_file() or path.name == CONFIG_FILE
        theirs = (
            str(checkpoint) == SWE_PRUNER_HUB_ID
            or path.suffix == ".safetensors"
            or (path / "model.safetensors").is_file()
        )
        dev = resolve_device(device)
        if not ours and theirs:
            model = load_swe_pruner(checkpoint, backbone=backbone or DEFAULT_BACKBONE, device=dev)
        else:
            model, _ = load_checkpoint(checkpoint, dev, backbone=backbone)
        return cls(model, threshold=threshold, repair=repair)

    def count_tokens(self, text: str) -> int:
        return len(self.model.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0

    def prune(
        self,
        text: str,
        query: str,
        *,
        budget: int | None = None,
        ratio: float | None = None,
        language: str | None = None,
    ) -> PruneResult:
        if not query or not query.strip():
            raise VkvError("LaMR needs a non-empty query")
        language = language or guess_language(text)
        original = self.count_tokens(text)
        if not text.strip():
            return PruneResult(text, list(range(len(split_lines(text)))), original, original, {"note": "empty input"})
        scores = score_lines(self.model, text, query, self.batch_size)
        report = {
            "backend": self.name,
            "language": language,
            "relevance": scores.relevance,
            "chunks": scores.chunks,
            "code_tokens": scores.code_tokens,
            "rubrics": list(self.model.config.rubrics),
            "repair": self.repair,
        }
        if budget is None and ratio is None:
            kept = select_lines(text, scores.keep_fraction, self.threshold)
            chosen = self._finish(text, kept, language)
            report.update(mode="threshold", threshold=self.threshold)
        else:
            limit = token_budget(original, budget, ratio)
            chosen = self._fit_budget(text, scores, language, limit)
            report.update(mode="budget", budget=limit, over_budget=chosen.tokens > limit)
        report.update(repair_method=chosen.repaired.method, added_by_repair=chosen.repaired.added)
        return PruneResult(chosen.repaired.text, chosen.repaired.kept, original, chosen.tokens, report)

    def _finish(self, text: str, kept: set[int], language: str) -> _Selection:
        result = (
            repair(text, kept, language, self.repair_config) if self.repair else render_selection(text, kept, language)
        )
        return _Selection(result, self.count_tokens(result.text))

    def _fit_budget(self, text: str, scores: LineScores, language: str, limit: int) -> _Selection:
        """Largest prefix of lines by keep probability whose rendered output fits (binary search)."""
        lines = split_lines(text)
        ranked = sorted(
            (i for i, p in enumerate(scores.keep_probability) if not math.isnan(p) and lines[i].strip()),
            key=lambda i: -scores.keep_probability[i],
        )
        best = self._finish(text, set(), language)
        low, high = 1, len(ranked)
        while low <= high:
            middle = (low + high) // 2
            candidate = self._finish(text, set(ranked[:middle]), language)
            if candidate.tokens <= limit:
                best, low = candidate, middle + 1
            else:
                high = middle - 1
        return best


def guess_language(text: str) -> str | None:
    """python when the text parses as Python, otherwise unknown (plain-text placeholders, no repair)."""
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    return "python"
