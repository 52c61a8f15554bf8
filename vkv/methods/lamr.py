from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vkv.backends.lamr import LaMR
from vkv.errors import VkvError
from vkv.home import vkv_home
from vkv.methods.base import TextMethod
from vkv.methods.work import TextWork
from vkv.settings import setting

PLACEHOLDER = "…"


def default_checkpoint() -> Path:

    return vkv_home() / "lamr-demo" / "semantic-dependency"


@dataclass
class LaMRMethod(TextMethod):
    """LaMR on the conversation: the span's messages are one document whose lines the learned pruner ranks by
    keep probability for the query; the best lines that fit the budget survive, so dense messages give up
    fewer lines than chatty ones. A removed run of lines inside a message becomes one `…` line."""

    name = "lamr"
    checkpoint: str | None = setting(None, "LaMR checkpoint directory (default: the demonstration one in $VKV_HOME)")
    _pruner: Any = field(default=None, init=False, repr=False, compare=False)  # loaded on first use

    def pruner(self):
        if self._pruner is None:
            checkpoint = Path(self.checkpoint or default_checkpoint())
            if not checkpoint.exists():
                raise VkvError(
                    f"--checkpoint {checkpoint}: no LaMR checkpoint there; train the demonstration one "
                    "with `python scripts/train_lamr_demo.py` or pass --checkpoint"
                )
            self._pruner = LaMR.from_checkpoint(checkpoint, repair=False)
        return self._pruner

    def prune(self, work: TextWork, ratio: float) -> list[str]:
        lines, owner = [], []
        for index, message in enumerate(work.messages):
            for line in message.content.splitlines() or [""]:
                lines.append(line)
                owner.append(index)
        result = self.pruner().prune("\n".join(lines), work.query, ratio=ratio)
        kept = set(result.kept_lines)
        return [
            _message_text([(i, lines[i]) for i in range(len(lines)) if owner[i] == m], kept)
            for m in range(len(work.messages))
        ]

    def config(self) -> dict:
        return {
            "checkpoint": str(self.checkpoint or default_checkpoint()),
            "query": "each evaluation question" if self.question_aware else "latest user request",
        }


def _message_text(numbered: list[tuple[int, str]], kept: set[int]) -> str:
    out: list[str] = []
    for i, line in numbered:
        if i in kept:
            out.append(line)
        elif not out or out[-1] != PLACEHOLDER:
            out.append(PLACEHOLDER)
    return "\n".join(out)
