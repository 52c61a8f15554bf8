"""Registry of context-compression methods, one file each; all share `Method.compress(work, ratio, on_step)`."""

from __future__ import annotations

from vkv.compress.work import SpanWork
from vkv.errors import VkvError
from vkv.methods.am import AttentionMatching
from vkv.methods.base import Method
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

# vkv's two modes that are methods of their own, registered and hashed into run ids under their earlier names so that
# stored runs keep their ids; the command line, sweep files and vkv.compress spell them vkv with a switch
PER_TURN_VKV = Sequential.name  # vkv per turn: --per-turn, per_turn
VERBATIM_VKV = Hybrid.name  # vkv with per-turn verbatim tokens over the whole span: --keep-verbatim, keep_verbatim
VKV_MODES = (PER_TURN_VKV, VERBATIM_VKV)


def registered_name(name: str, per_turn: bool | None = None, keep_verbatim: bool | None = None) -> str:
    """The registry's name of method `name` run with vkv's switches `per_turn` and `keep_verbatim` (per turn, the
    verbatim tokens are a setting of its recipe)."""
    if name != "vkv":
        return name
    return PER_TURN_VKV if per_turn else VERBATIM_VKV if keep_verbatim else name


def spoken_name(registered: str) -> str:
    """How tables name the method registered as `registered`: vkv's modes as vkv with their switch."""
    return {PER_TURN_VKV: "vkv per-turn", VERBATIM_VKV: "vkv keep-verbatim"}.get(registered, registered)


def get_method(name: str, **options) -> Method:
    if name not in METHODS:
        raise VkvError(f"unknown method '{name}'; choose from {', '.join(METHODS)}")
    cls = METHODS[name]
    return cls(**{k: v for k, v in options.items() if k in cls.option_names()})


__all__ = [
    "METHODS",
    "PER_TURN_VKV",
    "VERBATIM_VKV",
    "VKV_MODES",
    "Method",
    "SpanWork",
    "get_method",
    "registered_name",
]
