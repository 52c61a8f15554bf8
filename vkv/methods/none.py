from vkv.methods.base import Method, SpanWork


class NoContext(Method):
    """The span removed, later positions kept: the lower reference of every metric."""

    name = "none"
    uses_ratio = False

    def compress(self, work: SpanWork, ratio: float) -> None:
        return None
