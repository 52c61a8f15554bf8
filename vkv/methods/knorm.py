import torch

from ..cache import Segment
from .base import Method, SpanWork


class KeyNorm(Method):
    """Keep the tokens whose keys have the lowest L2 norm (averaged over layers and KV heads)."""

    name = "knorm"

    def compress(self, work: SpanWork, ratio: float) -> Segment:
        norms = work.acts.keys_pre_rope.norm(dim=-1).mean(dim=(0, 1))  # rotation keeps norms: pre = post
        keep = torch.topk(-norms, work.budget(ratio)).indices
        return work.keep(keep)
