"""Where vkv keeps fetched models and other state: $VKV_HOME, default ~/.cache/vkv."""

from __future__ import annotations

import os
from pathlib import Path


def vkv_home() -> Path:
    return Path(os.environ.get("VKV_HOME", Path.home() / ".cache" / "vkv")).expanduser()


def models_dir() -> Path:
    return vkv_home() / "models"
