"""Deterministic metrics: whole-token keyword matching, choice accuracy, retention and fidelity KL."""

from __future__ import annotations

import math
import re
from functools import lru_cache

import torch

# A keyword matches as a whole token: not inside a longer word (letters, digits, _ and - count as word
# characters), and not glued to one by inner punctuation such as node:test, bcrypt.js or done/failed (an answer
# that hedges between two values is not the value). When checking that a *transcript* states a fact, a slash
# separates path and module segments instead, so the keyword may be a whole segment: zerolog in
# github.com/rs/zerolog, hcl in hashicorp/hcl/v2. Hyphenated names stay whole either way: secret is not stated by
# dev-secret, nor argon2 by argon2-cffi (`vkv validate` names such forms so they can be added to accept).
_WORD = r"[\w-]"
_JOINER = r"[:./@]"
_JOINER_IN_PATHS = r"[:.@]"


@lru_cache(maxsize=1024)
def _pattern(keyword: str, joiner: str) -> re.Pattern:
    return re.compile(rf"(?<!{_WORD})(?<!\w{joiner}){re.escape(keyword)}(?!{_WORD})(?!{joiner}\w)", re.IGNORECASE)


def contains_keyword(text: str, keyword: str, in_paths: bool = False) -> bool:
    """`keyword` appears in `text` as a whole token; with `in_paths`, also as a whole path or module segment."""
    return _pattern(keyword.strip(), _JOINER_IN_PATHS if in_paths else _JOINER).search(text) is not None


def keyword_starts(text: str, keyword: str) -> list[int]:
    """Offsets in `text` where `keyword` begins as a whole token (as `contains_keyword` matches answers)."""
    return [m.start() for m in _pattern(keyword.strip(), _JOINER).finditer(text)]


def containing_forms(text: str, keyword: str) -> list[str]:
    """The longer names (`argon2-cffi`, `bcrypt.js`) in which `keyword` appears without matching as a token."""
    pattern = re.compile(rf"[\w:./@-]*{re.escape(keyword.strip())}[\w:./@-]*", re.IGNORECASE)
    return sorted({m.group(0).strip(":./@") for m in pattern.finditer(text)} - {keyword.strip()})


def keyword_correct(answer: str, accept: tuple[str, ...] | list[str], reject: tuple[str, ...] | list[str]) -> bool:
    """An accepted keyword appears and no rejected one does (case-insensitive, whole tokens)."""
    return any(contains_keyword(answer, a) for a in accept) and not any(contains_keyword(answer, r) for r in reject)


def retention(lp_method: float, lp_none: float, lp_full: float) -> float | None:
    """Fraction of the context's evidence kept: (lp_method − lp_none) / (lp_full − lp_none); None if no gap."""
    gap = lp_full - lp_none
    if gap <= 0:
        return None
    return (lp_method - lp_none) / gap


def kl_full_to_method(full_logp: torch.Tensor, method_logp: torch.Tensor) -> float:
    """Mean over positions of KL(full ‖ method) between next-token distributions `[positions, vocab]`."""
    p = full_logp.exp()
    return float((p * (full_logp - method_logp)).sum(-1).mean())


def mean(values) -> float | None:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(values) / len(values) if values else None
