"""Where vkv keeps fetched models and other state: $VKV_HOME, default ~/.cache/vkv."""

from __future__ import annotations

import os
from pathlib import Path

from vkv.errors import VkvError

KEY_FILE = "cache-signing.key"  # this user's secret key for signing caches (vkv.kv.sign)
MODELS = "models"
HELD = {  # what vkv keeps in its home that no command's output may replace, and what a sentence calls it
    KEY_FILE: "your cache signing key",
    MODELS: "the fetched models",
}


def vkv_home() -> Path:
    """$VKV_HOME, or ~/.cache/vkv where it is unset or empty (an empty value, taken as a path, would be the working
    directory, where the secret signing key does not belong)."""
    given = os.environ.get("VKV_HOME")
    return Path(given).expanduser() if given else Path.home() / ".cache" / "vkv"


def models_dir() -> Path:
    return vkv_home() / MODELS


def check_home() -> Path:
    """vkv's home, refused in one sentence when it, or the nearest part of its path that exists, is not a directory
    (no model could be fetched and no key made there)."""
    home = vkv_home()
    existing = home
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "is" if existing == home else f"would lie under {existing}, which is"
        raise VkvError(
            f"{home}: vkv's home (VKV_HOME) {where} not a directory; set VKV_HOME to a directory for vkv's models "
            "and signing key"
        )
    return home
