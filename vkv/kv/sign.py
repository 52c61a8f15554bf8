"""Cache files signed with the user's own secret key, so that a file edited by anyone else is refused.

A digest (sha256 of the file's contents, vkv.kv.check) tells a damaged file from the one written, but anyone who
edits a file can compute it again; edits that keep every magnitude (signs flipped, entries shuffled) then pass the
plausibility check too. An HMAC-SHA256 needs the key to compute: vkv keeps one secret key per user under its home
($VKV_HOME/cache-signing.key, made on the first write, readable by the user alone) and signs every file it writes.

What is signed is the whole header as JSON with sorted keys, the digest and key id included; the digest covers every
tensor's name, dtype, shape and bytes, so the signature vouches for them through it (the loader checks both). The
header records the key's id (the first 16 hex digits of the key's sha256, which does not reveal the key), so a file
signed with another user's key is named as such rather than as edited.

What it does not promise: anyone who can read the key file can sign what they like; and a file from another user (or
older than signatures) can only be loaded by choosing to trust it, when the digest and plausibility checks still apply.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any

from vkv.errors import VkvError
from vkv.home import KEY_FILE, check_home, vkv_home

KEY_BYTES = 32  # as long as SHA-256's output, the least RFC 2104 recommends for HMAC-SHA256
KEY_SIZES = (2 * KEY_BYTES, 2 * KEY_BYTES + 1)  # its hex digits, without or with the newline vkv writes after them
TRUST_HOW = (
    "pass --trust-foreign (Python: trust_foreign=True) to load it anyway, still checked by its digest and against "
    "the model"
)


def key_path() -> Path:
    return vkv_home() / KEY_FILE


def key_id(key: bytes) -> str:
    """What a header records of the key it was signed with: enough to tell keys apart, nothing to sign with."""
    return hashlib.sha256(key).hexdigest()[:16]


def own_key(create: bool = False) -> bytes | None:
    """This user's signing key; None when there is none yet and `create` is false. Created at most once: a key already
    there (made by another vkv process meanwhile, too) is never replaced, since every file it signed would turn foreign."""
    path = key_path()
    if os.path.lexists(path):  # a dangling link too: it is refused as such, not replaced by a new key
        return _read_key(path)
    if not create:
        return None
    check_home()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{KEY_FILE}.", dir=path.parent)  # mode 0600 whatever the umask
    except OSError as exc:
        raise VkvError(
            f"{path}: cannot create the cache signing key ({exc.strerror}); make {path.parent} writable or set "
            "VKV_HOME to a writable directory"
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_bytes(KEY_BYTES).hex() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic and exclusive: the key appears whole, and only if none is there
        except FileExistsError:
            pass  # another process made it first: use theirs
        except OSError:  # a file system without hard links: exclusive creation, then the bytes
            _create_exclusive(path, Path(tmp).read_bytes())
    finally:
        os.unlink(tmp)
    return _read_key(path)


def check_key() -> None:
    """Before work that ends in signing a cache: this user's key read and checked, or made now where there is none, so
    that a key that cannot be made or read, is open to others, damaged, or a link out of vkv's home is one sentence
    before the work instead of the work thrown away after it."""
    own_key(create=True)


def _create_exclusive(path: Path, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _read_key(path: Path) -> bytes:
    """The key in `path` (hex), refused when others may read or replace it, when it is not a key, or when it is a
    link that leads nowhere or out of vkv's home (where whoever controls the target controls the key). Read with a
    size limit: a huge file there is refused, not read whole."""
    if path.is_symlink():
        target = path.resolve()
        if not target.exists():
            raise VkvError(
                f"{path}: the cache signing key is a link to {os.readlink(path)}, which does not exist; restore the "
                "key there, or remove the link to make a new key (the caches the old one signed then load only with "
                "--trust-foreign)"
            )
        if vkv_home().resolve() not in target.parents:
            raise VkvError(
                f"{path}: the cache signing key is a link out of vkv's home (to {target}); put the key file itself "
                "there"
            )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO there is refused below, not waited on
    except OSError as exc:
        raise VkvError(f"{path}: cannot read the cache signing key ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise VkvError(f"{path}: the cache signing key is not a regular file")
        if info.st_mode & 0o077:
            raise VkvError(
                f"{path}: the cache signing key is open to other users (mode {stat.S_IMODE(info.st_mode):04o}), who "
                f"could sign edited caches with it; run chmod 600 {path}"
            )
        data = handle.read(max(KEY_SIZES) + 1) if info.st_size in KEY_SIZES else b""
    try:
        key = bytes.fromhex(data.decode("ascii").strip()) if len(data) in KEY_SIZES else b""
    except (UnicodeDecodeError, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise VkvError(
            f"{path}: the cache signing key is damaged (expected {2 * KEY_BYTES} hex digits, found a file of "
            f"{info.st_size} bytes that does not hold them); remove it to make a new one, after which the caches it "
            "signed load only with --trust-foreign"
        )
    return key


def canonical(header: dict[str, Any]) -> bytes:
    """The bytes a signature covers: the header (as its file holds it, less the signature itself) as JSON with
    sorted keys and no spaces, so that writing and reading the same header give the same bytes."""
    signed = {k: v for k, v in header.items() if k != "signature"}
    return json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def signature(header: dict[str, Any], key: bytes) -> str:
    return hmac.new(key, canonical(header), hashlib.sha256).hexdigest()


def sign(header: dict[str, Any]) -> dict[str, Any]:
    """`header` (JSON-compatible, holding its digest) with this user's `key_id` and `signature`; makes the key on the
    first write."""
    key = own_key(create=True)
    signed = {k: v for k, v in header.items() if k not in ("key_id", "signature")}
    signed["key_id"] = key_id(key)
    signed["signature"] = signature(signed, key)
    return signed


def unsigned_reason(header: dict[str, Any], signed_since: int) -> str | None:
    """None when `header` carries a signature made with this user's key over exactly it; else why not, as
    '<field>: <reason>' (the field named first, for the sentence that refuses the file)."""
    version = header.get("format_version")
    if isinstance(version, int) and version < signed_since:
        return f"signature: none, as format version {version} predates signed caches, so an edit cannot be ruled out"
    key = own_key()
    mine = key_id(key) if key is not None else None
    if header.get("key_id") != mine:
        yours = f"yours is {mine}" if mine else f"you have none yet at {key_path()}"
        return (
            f"key_id: signed with another key ({_short(header.get('key_id'))}; {yours}): another user's file, which "
            "its holder may have edited"
        )
    found = header.get("signature")
    if not (isinstance(found, str) and found.isascii() and hmac.compare_digest(found, signature(header, key))):
        return "signature: does not match the file under your key, so it was edited after it was written"
    return None


def _short(value: Any) -> str:
    text = value if isinstance(value, str) and value.isprintable() else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
