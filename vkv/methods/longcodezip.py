from dataclasses import dataclass
from typing import Any

from vkv.backends.longcodezip import LongCodeZip
from vkv.methods.base import TextMethod
from vkv.methods.work import TextWork


@dataclass
class LongCodeZipMethod(TextMethod):
    """LongCodeZip on the conversation: messages are coarse chunks ranked by conditional perplexity against
    the latest user request; paragraphs, code fences and lines inside kept messages are pruned by knapsack."""

    name = "longcodezip"
    settings: Any = None  # a backends.longcodezip Settings; None: its defaults

    def prune(self, work: TextWork, ratio: float) -> list[str]:
        pruner = LongCodeZip(work.lm, settings=self.settings)
        result = pruner.prune_messages([m.content for m in work.messages], work.query, ratio=ratio)
        return result.report["messages"]

    def config(self) -> dict:
        return {
            "settings": vars(self.settings) if self.settings is not None else "defaults",
            "query": "each evaluation question" if self.question_aware else "latest user request",
        }
