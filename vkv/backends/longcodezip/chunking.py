"""Coarse chunks: functions, classes, runs of module-level code, paragraphs, fenced blocks, messages.

Chunks partition the document's lines, so dropping chunks and rendering their gaps is enough to
rebuild the text. Leading comments and attributes belong to the definition they precede. A class
above `class_tokens` is split into its members (the class header stays with the first one); any
chunk above `piece_tokens` — which could never be selected whole — is split along its statements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from vkv.backends.longcodezip.units import Document


@dataclass(frozen=True)
class Chunk:
    start: int  # first line
    end: int  # one past the last line
    kind: str  # function | class | code | paragraph | fence | message | piece
    name: str
    units: tuple[int, ...]  # the sibling units the chunk is made of
    head: int | None  # the definition whose skeleton (signature, braces) is kept with any of its lines

    @property
    def line_count(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ChunkLimits:
    class_tokens: int  # a class above this is split into its members
    piece_tokens: int  # anything above this is split along its statements


@dataclass
class _Piece:
    start: int
    units: list[int]
    kind: str
    name: str
    head: int | None


def chunk_document(doc: Document, line_tokens: np.ndarray, limits: ChunkLimits) -> list[Chunk]:
    """Partition `doc` into chunks; `line_tokens[i]` is the token count of line i."""
    if not doc.lines:
        return []
    cumulative = np.concatenate([[0], np.cumsum(line_tokens)])
    top = _to_chunks(_group(doc, doc.top_level()), 0, len(doc.lines))
    return [piece for chunk in top for piece in _refine(doc, chunk, cumulative, limits)]


def _group(doc: Document, members: list[int]) -> list[_Piece]:
    """Definitions get a chunk each (with the comments right above them); other units merge into runs."""
    pieces: list[_Piece] = []
    pending: list[int] = []  # comments/attributes not yet known to precede a definition
    run: _Piece | None = None

    def flush(into_run: list[int]) -> None:
        nonlocal run
        for uid in into_run:
            unit = doc.units[uid]
            kind = "paragraph" if unit.kind == "text" else "code"
            if run is None or (kind == "paragraph" and doc.units[run.units[-1]].end + 1 < unit.start):
                run = _Piece(unit.start, [], kind, "module code" if kind == "code" else unit.name, None)
                pieces.append(run)
            run.units.append(uid)

    for uid in members:
        unit = doc.units[uid]
        if unit.kind in ("comment", "attached"):
            pending.append(uid)
        elif unit.is_definition:
            attached = _directly_above(doc, pending, unit.start)
            flush(pending[: len(pending) - len(attached)])
            pending, run = [], None
            first = doc.units[attached[0]].start if attached else unit.start
            pieces.append(_Piece(first, attached + [uid], unit.kind, unit.name, uid))
        else:
            flush(pending + [uid])
            pending = []
    flush(pending)
    return pieces


def _directly_above(doc: Document, pending: list[int], line: int) -> list[int]:
    """The tail of `pending` that touches `line` with no blank line in between."""
    attached: list[int] = []
    for uid in reversed(pending):
        if doc.units[uid].end + 1 != line:
            break
        attached.insert(0, uid)
        line = doc.units[uid].start
    return attached


def _to_chunks(pieces: list[_Piece], start: int, end: int) -> list[Chunk]:
    """Pieces to line spans covering [start, end): each runs to the next piece's first line."""
    pieces = [p for i, p in enumerate(pieces) if i == 0 or p.start > pieces[i - 1].start]
    chunks = []
    for i, piece in enumerate(pieces):
        first = start if i == 0 else piece.start
        last = pieces[i + 1].start if i + 1 < len(pieces) else end
        chunks.append(Chunk(first, last, piece.kind, piece.name, tuple(piece.units), piece.head))
    return chunks


def _refine(doc: Document, chunk: Chunk, cumulative: np.ndarray, limits: ChunkLimits) -> list[Chunk]:
    size = int(cumulative[chunk.end] - cumulative[chunk.start])
    split_class = chunk.kind == "class" and size > limits.class_tokens
    too_big = size > limits.piece_tokens
    if not (split_class or too_big):
        return [chunk]
    members = _inner_members(doc, chunk)
    pieces = _group(doc, members)
    if len(pieces) < 2 and too_big:
        limit = min(limits.class_tokens, limits.piece_tokens)
        pieces = _pack(doc, members, cumulative, chunk.start, chunk.end, limit)
    if len(pieces) < 2:
        return [chunk]  # one statement that cannot be split further
    sub = _to_chunks(pieces, chunk.start, chunk.end)
    # The first piece carries the header, so it stays the chunk it was split from.
    sub[0] = replace(sub[0], kind=chunk.kind, name=chunk.name, head=chunk.head)
    return [piece for part in sub for piece in _refine(doc, part, cumulative, limits)]


def _inner_members(doc: Document, chunk: Chunk) -> list[int]:
    """What a chunk splits into: a lone definition's statements, or the chunk's own units."""
    leading = [u for u in chunk.units if doc.units[u].kind in ("comment", "attached")]
    main = [u for u in chunk.units if u not in leading]
    if len(main) == 1 and doc.units[main[0]].bodies:
        return leading + doc.children(main[0])
    return list(chunk.units)


def _pack(doc: Document, members: list[int], cumulative: np.ndarray, start: int, end: int, limit: int) -> list[_Piece]:
    """Consecutive members packed into pieces of at most `limit` tokens (one member may exceed it);
    the first piece also carries the header lines from `start`."""
    starts = [doc.units[u].start for u in members] + [end]
    starts[0] = start
    pieces: list[_Piece] = []
    size = 0
    for i, uid in enumerate(members):
        segment = int(cumulative[starts[i + 1]] - cumulative[starts[i]])
        if pieces and size + segment <= limit:
            pieces[-1].units.append(uid)
            size += segment
        else:
            pieces.append(_Piece(starts[i], [uid], "piece", doc.units[uid].name, None))
            size = segment
    return pieces
