"""Registry of context-compression methods, one file each; all share `Method.compress(work, ratio, on_step)`."""

from __future__ import annotations

from vkv.errors import VkvError
from vkv.methods.am import AttentionMatching
from vkv.methods.base import Method, SpanWork
from vkv.methods.full import Full
from vkv.methods.hybrid import Hybrid
from vkv.methods.knorm import KeyNorm
from vkv.methods.kvopt import KVOpt
from vkv.methods.kvzip import KVzip
from vkv.methods.lamr import LaMRMethod
from vkv.methods.longcodezip import LongCodeZipMethod
from vkv.methods.none import NoContext
from vkv.methods.reuse import Reuse
from vkv.methods.sequential import Sequential
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
        Sequential,
        Hybrid,
        LaMRMethod,
        Reuse,
    )
}

# vkv per turn (vkv with per_turn) is a method of its own, registered and hashed into run ids under its earlier name
# so that stored runs keep their ids; the command line, sweep files and vkv.compress spell it vkv with per_turn
PER_TURN_VKV = Sequential.name


def registered_name(name: str, per_turn: bool | None) -> str:
    """The registry's name of method `name` run with `per_turn`."""
    return PER_TURN_VKV if name == "vkv" and per_turn else name


def get_method(name: str, **options) -> Method:
    if name not in METHODS:
        raise VkvError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")
    cls = METHODS[name]
    return cls(**{k: v for k, v in options.items() if k in cls.option_names()})


__all__ = ["METHODS", "PER_TURN_VKV", "Method", "SpanWork", "get_method", "registered_name"]
