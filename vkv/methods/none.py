from dataclasses import dataclass

from vkv.compress.work import SpanWork
from vkv.methods.base import Method


@dataclass
class NoContext(Method):
    """The span removed, later positions kept: the lower reference of every metric."""

    name = "none"
    uses_ratio = False
    reference = True

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> None:
        return None
