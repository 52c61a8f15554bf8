"""Reading a file to prune: UTF-8 only, with errors that name the file."""

from __future__ import annotations

from pathlib import Path

from vkv.errors import VkvError


def read_source(path: str | Path) -> str:
    """The file's text exactly as stored (line endings kept); a VkvError if it is missing or not UTF-8."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise VkvError(f"{file}: no such file") from None
    except IsADirectoryError:
        raise VkvError(f"{file}: is a directory, not a file") from None
    except OSError as exc:
        raise VkvError(f"{file}: cannot be read ({exc.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VkvError(f"{file}: not valid UTF-8 (undecodable byte at offset {exc.start})") from None
