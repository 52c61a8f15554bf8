from vkv.kv.segment import Segment
from vkv.methods.base import Method, SpanWork


class Full(Method):
    """The uncompressed context: the upper reference of every metric."""

    name = "full"
    uses_ratio = False

    def compress(self, work: SpanWork, ratio: float) -> Segment:
        return work.keep(list(range(work.span_length)))
