"""Registry of context-compression methods, one file each; all share `Method.compress(work, ratio, on_step)`."""

from __future__ import annotations

from vkv import upgrade
from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.methods.am import AttentionMatching
from vkv.methods.base import Method
from vkv.methods.full import Full
from vkv.methods.knorm import KeyNorm
from vkv.methods.kvopt import KVOpt
from vkv.methods.kvzip import KVzip
from vkv.methods.lamr import LaMRMethod
from vkv.methods.longcodezip import LongCodeZipMethod
from vkv.methods.none import NoContext
from vkv.methods.reuse import Reuse
from vkv.methods.snapkv import SnapKV
from vkv.methods.streaming import Streaming
from vkv.methods.truncate import Truncate
from vkv.methods.vkv import MeanPool, VirtualTokens

METHODS: dict[str, type[Method]] = {
    cls.name: cls
    for cls in (
        Full,
        NoContext,
        Truncate,
        MeanPool,
        VirtualTokens,
        Streaming,
        SnapKV,
        KeyNorm,
        LongCodeZipMethod,
        AttentionMatching,
        KVzip,
        KVOpt,
        LaMRMethod,
        Reuse,
    )
}


def get_method(name: str, **options) -> Method:
    renamed = upgrade.renamed_method(name)
    if renamed:
        raise VkvError(renamed)
    if name not in METHODS:
        raise VkvError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")
    cls = METHODS[name]
    return cls(**{k: v for k, v in options.items() if k in cls.option_names()})


__all__ = [
    "METHODS",
    "Method",
    "SpanWork",
    "get_method",
]
