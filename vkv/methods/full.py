from dataclasses import dataclass

from vkv.compress.work import SpanWork
from vkv.kv.segment import Segment
from vkv.methods.base import Method


@dataclass
class Full(Method):
    """The uncompressed context: the upper reference of every metric."""

    name = "full"
    uses_ratio = False
    reference = True

    def compress(self, work: SpanWork, ratio: float, on_step=None) -> Segment:
        return work.keep(list(range(work.span_length)))
