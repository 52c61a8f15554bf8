"""Registry of context-compression methods, one file each; all share `Method.compress(work, ratio)`."""

from __future__ import annotations

from ..errors import VkvError
from .base import Method, SpanWork
from .full import Full
from .hybrid import Hybrid
from .knorm import KeyNorm
from .lamr import LaMRMethod
from .longcodezip import LongCodeZipMethod
from .none import NoContext
from .sequential import Sequential
from .snapkv import SnapKV
from .streaming import Streaming
from .truncate import Truncate
from .virtual import MeanPool, VirtualTokens

METHODS: dict[str, type[Method]] = {
    cls.name: cls for cls in (
        Full, NoContext, Truncate, MeanPool, VirtualTokens, Streaming, SnapKV, KeyNorm, LongCodeZipMethod,
    )
}
METHODS.update({cls.name: cls for cls in (Sequential, Hybrid)})  # multi-turn methods (issue 5)
METHODS[LaMRMethod.name] = LaMRMethod  # needs a trained checkpoint (issue 8)


def get_method(name: str, **options) -> Method:
    if name not in METHODS:
        raise VkvError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")
    cls = METHODS[name]
    return cls(**{k: v for k, v in options.items() if k in cls.options_taken})


__all__ = ["METHODS", "Method", "SpanWork", "get_method"]
