"""Reading a file to prune: UTF-8 only, with errors that name the file."""

from __future__ import annotations

from pathlib import Path

from vkv.errors import VkvError
from vkv.io import DEFAULT_SOURCE_MB, SOURCE_LIMIT_ENV, read_input


def read_source(path: str | Path) -> str:
    """The file's text exactly as stored (line endings kept); a VkvError if it is missing, not a regular file,
    larger than the limit ($VKV_MAX_SOURCE_MB) or not UTF-8."""
    file = Path(path)
    # bounded before the tokenizer sees it: it holds ~200 bytes per byte of text, so a 50 MB file took 10 GB
    data = read_input(file, "file to prune", SOURCE_LIMIT_ENV, DEFAULT_SOURCE_MB)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VkvError(f"{file}: not valid UTF-8 (undecodable byte at offset {exc.start})") from None
