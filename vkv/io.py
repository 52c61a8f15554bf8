"""Atomic file writes: a crash mid-write never leaves a half-written result or cache behind."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vkv.errors import VkvError


def check_writable(path: str | os.PathLike, field: str) -> None:
    """Refuse, before any work, an output file that could not be written: one that is a directory, or whose directory
    does not exist or is not writable (nothing is created here)."""
    target = Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise VkvError(f"{target}: field {field}: is a directory, not a file to write")
    if not parent.is_dir():
        raise VkvError(f"{target}: field {field}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise VkvError(f"{target}: field {field}: not writable")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as written:  # on disk before it replaces anything
            os.fsync(written.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes files private; the user's umask decides
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=jsonable) + "\n")


def jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
