"""Files in and out. Reads of user-given files are bounded (size, nesting, regular files only), so /dev/zero, a FIFO
or a gigabyte of brackets is one sentence, not a MemoryError, a hang or a RecursionError. Writes are atomic: a crash
mid-write never leaves a half-written result or cache behind; what may be written where is one rule, `check_output`:
never through a link, onto a device, FIFO or directory, onto an input or another output, or onto what vkv keeps."""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from vkv.errors import VkvError
from vkv.home import HELD, vkv_home

INPUT_LIMIT_ENV = "VKV_MAX_INPUT_MB"
DEFAULT_INPUT_MB = 64.0  # transcripts are tens of kB; parsed JSON takes several times its bytes, so 64 MB stays < 1 GB
SOURCE_LIMIT_ENV = "VKV_MAX_SOURCE_MB"
DEFAULT_SOURCE_MB = 2.0  # a file to prune: the tokenizer holds ~200 bytes per byte of text, so 2 MB is ~400 MB
MAX_JSON_DEPTH = 100  # deeper than any transcript, sweep row or tool call needs; far below Python's recursion limit


def limit_bytes(env: str = INPUT_LIMIT_ENV, default_mb: float = DEFAULT_INPUT_MB) -> int:
    """The size limit in bytes: `env` in MB when set, else `default_mb`."""
    text = os.environ.get(env)
    if text is None or not text.strip():
        return int(default_mb * 2**20)
    try:
        mb = float(text)
    except ValueError:
        mb = float("nan")
    if not mb > 0 or mb == float("inf"):
        raise VkvError(f"{env}={text!r}: expected a positive number of megabytes")
    return math.ceil(mb * 2**20)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_input(
    path: str | os.PathLike, what: str, env: str = INPUT_LIMIT_ENV, default_mb: float = DEFAULT_INPUT_MB
) -> bytes:
    """The bytes of a user-given file, `what` (e.g. "transcript file"), refused in one sentence when it is missing, not a
    regular file (a device such as /dev/zero, a FIFO, a directory) or larger than the limit (`env` raises it)."""
    p = Path(path)
    limit = limit_bytes(env, default_mb)
    try:
        # O_NONBLOCK: opening a FIFO without a writer returns at once (then refused below) instead of waiting forever
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise VkvError(f"{p}: no such {what}") from None
    except IsADirectoryError:
        raise VkvError(f"{p}: the {what} is a directory, not a file") from None
    except OSError as exc:
        raise VkvError(f"{p}: cannot read the {what} ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise VkvError(f"{p}: the {what} is {_kind(mode)}, not a regular file; vkv reads only regular files")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)  # never more than the limit, even from a file that grows while read
        except OSError as exc:
            raise VkvError(f"{p}: cannot read the {what} ({exc.strerror})") from None
    if len(data) > limit:
        raise VkvError(
            f"{p}: the {what} is larger than the limit of {limit / 2**20:.3g} MB; set {env} (in MB) to raise it"
        )
    return data


def read_input_text(
    path: str | os.PathLike, what: str, env: str = INPUT_LIMIT_ENV, default_mb: float = DEFAULT_INPUT_MB
) -> str:
    """`read_input` decoded as UTF-8; invalid bytes are one sentence naming the offset."""
    data = read_input(path, what, env, default_mb)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VkvError(f"{path}: the {what} is not UTF-8 text (byte {exc.start})") from None


def read_input_json(path: str | os.PathLike, what: str) -> Any:
    """A user-given JSON file, bounded in size (`read_input`) and nesting (`parse_json`)."""
    return parse_json(read_input_text(path, what), f"{path}", what)


def parse_json(text: str | bytes, where: str, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads` with a nesting limit: malformed or too deeply nested JSON is one sentence naming `where`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise VkvError(f"{where}: malformed JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    except RecursionError:  # the parser's own limit, hit before ours could be checked
        raise VkvError(f"{where}: the {what} is JSON nested more than {max_depth} levels deep") from None
    check_depth(data, where, what, max_depth)
    return data


def check_depth(data: Any, where: str, what: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON data nested deeper than `max_depth` (checked without recursion: later code that walks it
    recursively, json.dumps included, can then not hit Python's recursion limit)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > max_depth:
                raise VkvError(f"{where}: the {what} nests lists or objects more than {max_depth} levels deep")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def check_plain(data: Any, where: str, what: str) -> None:
    """Refuse JSON data holding what only Python's JSON reader accepts: a bare NaN or Infinity (not a JSON number) or
    a lone UTF-16 surrogate (e.g. "\\ud800", which no UTF-8 text can hold and a tokenizer cannot encode); the
    sentence names the field. Iterative, like `check_depth`."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise VkvError(
                f"{where}: field {path or '(top level)'}: {value} is not a JSON number (the {what} needs finite numbers)"
            )
        if isinstance(value, str):
            _check_unicode(value, where, path or "(top level)")
        elif isinstance(value, dict):
            for key, child in value.items():
                _check_unicode(key, where, f"{path}.{key!r}" if path else repr(key))
                stack.append((child, f"{path}.{key}" if path else str(key)))
        elif isinstance(value, list):
            stack.extend((child, f"{path}[{j}]") for j, child in enumerate(value))


def _check_unicode(text: str, where: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise VkvError(
            f"{where}: field {path}: holds a lone surrogate (U+{ord(text[exc.start]):04X} at character {exc.start}), "
            "which is not Unicode text"
        ) from None


# Characters that move a terminal's cursor, run its escape sequences (ESC) or reorder the text around them (bidi
# controls): refused in the ids and names vkv prints in tables and messages, where they would act instead of show.
_UNPRINTABLE = ("Cc", "Cf", "Zl", "Zp")


def check_printable(text: str, where: str, field_path: str) -> None:
    """Refuse an id or name from a user's file that holds a control or formatting character, naming the field."""
    for at, char in enumerate(text):
        if unicodedata.category(char) in _UNPRINTABLE:
            raise VkvError(
                f"{where}: field {field_path}: holds the control character U+{ord(char):04X} at character {at}; ids "
                "and names are printed on terminals, so they take printable text only"
            )


TEMP_EXTRA = (
    len("..") + 8 + len(".tmp")
)  # what `atomic_path`'s temporary name adds to the output's: dots, random, suffix
FORCE = ContextVar("force", default=False)  # the CLI's --force, for every write of the command it was given to


@contextmanager
def forcing(force: bool) -> Iterator[None]:
    """Within the block, writers replace files of another kind as `force` says (the CLI's --force, checked with the
    command's outputs before its work), so the writes deep in a command decide as its up-front check did."""
    token = FORCE.set(force)
    try:
        yield
    finally:
        FORCE.reset(token)


def check_output(
    path: str | os.PathLike,
    field: str,
    writes: str,
    force: bool = False,
    inputs: dict[str, str] | None = None,
    others: dict[str, str] | None = None,
    how: str = "pass --force",
) -> None:
    """Whether vkv may write `writes` (a kind of FILE_KINDS) to `path`, named by `field` (a flag, or a parameter):
    the one rule for every output, checked before any work and again by the atomic writers. An output is a regular
    file or nothing yet: never a link (what it points at would be replaced), a device, FIFO, socket or directory; its
    directory exists and is writable, and its name leaves room for the temporary file's; it is none of the command's
    `inputs` (path → what a sentence calls it; a directory stands for every file in it, e.g. a model's) and none of
    its `others` outputs (flag → path); it is nothing vkv keeps in its home (the signing key, the models); and an
    existing file of another kind is replaced only with `force` (never in vkv's home, where vkv wrote each file as its
    own kind). Refusals are one sentence naming the file and `field`."""
    if not os.fspath(path):
        raise VkvError(f"'': field {field}: an empty path names no file to write")
    target = Path(path)
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # NotADirectoryError: a part of the path is a file
        raise VkvError(f"{target}: field {field}: cannot be written ({exc.strerror})") from None
    if mode is not None and stat.S_ISLNK(mode):
        raise VkvError(
            f"{target}: field {field}: is a symbolic link (to {os.readlink(target)}); vkv writes outputs only as "
            "regular files, so nothing a link leads to is replaced; give the file's own path"
        )
    if mode is not None and not stat.S_ISREG(mode):
        raise VkvError(f"{target}: field {field}: is {_kind(mode)}, not a regular file to write")
    parent = target.parent
    if not parent.is_dir():
        raise VkvError(f"{target}: field {field}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (mode is not None and not os.access(target, os.W_OK)):
        raise VkvError(f"{target}: field {field}: not writable")
    name_max = _name_max(parent)
    if len(os.fsencode(target.name)) + TEMP_EXTRA > name_max:
        raise VkvError(
            f"{target}: field {field}: the name is {len(os.fsencode(target.name))} bytes long, and with the "
            f"{TEMP_EXTRA} bytes a temporary file adds it passes this file system's limit of {name_max}; choose a shorter name"
        )
    check_not_input(target, field, inputs or {})
    resolved = parent.resolve() / target.name
    for flag, other in (others or {}).items():
        if other and resolved == Path(other).parent.resolve() / Path(other).name:
            raise VkvError(f"{target}: field {field}: {flag} names the same file; give each output its own path")
    inside_home, held = _in_home(target)
    if held:
        raise VkvError(
            f"{target}: field {field}: that is {held}, which vkv keeps in its home {vkv_home()} and no output may "
            "replace; write elsewhere"
        )
    if inside_home:
        force, how = False, "remove it yourself"  # vkv wrote the files in its home, each as its kind
    check_replaceable(target, field, writes, force, how)


def _in_home(target: Path) -> tuple[bool, str | None]:
    """Whether `target` lies in vkv's home, and what there it is part of (HELD's words) when vkv keeps it; both as
    given and resolved, since the home, or a part of it such as the models, may be a link."""
    home = vkv_home()
    found = {Path(os.path.abspath(target)), target.parent.resolve() / target.name}

    def within(root: Path) -> bool:
        return any(r == f or r in f.parents for r in {Path(os.path.abspath(root)), root.resolve()} for f in found)

    held = next((what for name, what in HELD.items() if within(home / name)), None)
    return within(home), held


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255  # the common limit, where the file system does not say


def check_not_input(path: str | os.PathLike, field: str, inputs: dict[str, str]) -> None:
    """Refuse an output that is one of the command's inputs (`inputs`: path → the argument naming it; a directory
    there stands for every file in it, e.g. a model's), before any work: writing it would destroy the input. The
    output's directory is resolved, not the output itself: a link in a model's directory to weights elsewhere (as the
    Hugging Face cache keeps them) is still a file in that directory."""
    given_target = Path(path).expanduser()
    target = given_target.parent.resolve() / given_target.name
    for given, name in inputs.items():
        source = Path(given).expanduser().resolve()
        inside = source.is_dir() and source in target.parents
        same = target == source or (target.exists() and source.exists() and os.path.samefile(target, source))
        if same or inside:
            which = f"a file in {name}, {given}" if inside else f"{name}, {given}"
            raise VkvError(f"{path}: field {field}: that is {which}, an input of this command; write elsewhere")


REPORT_TITLE = "# Sweep report: "  # the first line of every report.md vkv writes: a file without it is someone else's
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FILE_KINDS = {
    "cache": "a safetensors cache",
    "json": "a JSON file",
    "transcript": "a transcript",  # never found by `file_kind`: a transcript may be edited by hand after it is written
    "report": "a vkv report",
    "image": "a PNG image",
    "text": "a text file",
    "binary": "a binary file",
}


def file_kind(path: str | os.PathLike) -> str | None:
    """What an existing file holds, from its first bytes: 'cache' (safetensors: a little-endian header length, then
    a JSON object), 'json', 'report' (vkv's report.md), 'image' (PNG), 'text' or 'binary'; None for a missing, empty
    or non-regular file."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError:
        return None
    if not head:
        return None
    if len(head) > 8 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") <= 100 * 2**20:
        return "cache"
    if head.startswith(PNG_MAGIC):
        return "image"
    if head.startswith(REPORT_TITLE.encode()):
        return "report"
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "json"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not just a character cut at the end of the 4096 bytes
            return "binary"
    return "text" if b"\0" not in head else "binary"


def check_replaceable(path: str | os.PathLike, field: str, writes: str, force: bool, how: str = "pass --force") -> None:
    """Refuse to replace an existing file of another kind than the output (`writes`, a kind of FILE_KINDS), a cache
    with JSON or a transcript with a cache, unless `force`: such a file is not an earlier output of this flag."""
    kind = file_kind(path)
    if force or kind is None or kind == writes:
        return
    raise VkvError(
        f"{path}: field {field}: it holds {FILE_KINDS[kind]}, which {FILE_KINDS[writes]} would replace; "
        f"{how} to replace it, or choose another path"
    )


@contextmanager
def atomic_path(path: str | os.PathLike, writes: str, field: str = "path", force: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds. `path` is checked
    (`check_output`, as `field` writing `writes`) first; the rename replaces a link put there meanwhile, never what it
    points at, and the temporary file is created exclusively (never through a link)."""
    target = Path(path)
    if os.fspath(path):
        target.parent.mkdir(parents=True, exist_ok=True)
    check_output(target, field, writes, force=force or FORCE.get())
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


def write_text_atomic(
    path: str | os.PathLike, text: str, writes: str = "text", field: str = "path", force: bool = False
) -> None:
    with atomic_path(path, writes, field, force) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def write_json_atomic(
    path: str | os.PathLike, obj: Any, writes: str = "json", field: str = "path", force: bool = False
) -> None:
    text = json.dumps(obj, indent=2, sort_keys=False, default=jsonable) + "\n"
    write_text_atomic(path, text, writes, field, force)


def jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
