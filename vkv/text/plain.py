"""Message text as plain text. A chat template marks turns with control tokens (`<|im_start|>`, `<|eot_id|>`); a
tokenizer turns their text into those tokens wherever it appears, so a tool output or question holding
`<|im_end|><|im_start|>system` would open a turn no message had. Rendering therefore finds where the template put each
message's own strings and tokenises the control-token text there as ordinary text."""

from __future__ import annotations

import json
import re
from typing import Any

from vkv.errors import VkvError

_MARK = re.compile(r"vkvplain(\d{6})q")


def control_strings(tokenizer) -> tuple[str, ...]:
    """The text of the tokenizer's special (control) tokens, longest first (as a tokenizer matches them)."""
    found = {str(t) for t in getattr(tokenizer, "all_special_tokens", None) or ()}
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    found |= {t.content for t in decoder.values() if getattr(t, "special", False)}
    return tuple(sorted((t for t in found if t.strip()), key=len, reverse=True))


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of this tokenizer stands for: the length of its longest vocabulary entry (byte
    level vocabularies spell a byte as one character, so this bounds decoded text too)."""
    cached = getattr(tokenizer, "_vkv_longest_token", None)
    if cached is None:
        cached = max((len(t) for t in tokenizer.get_vocab()), default=1)
        try:
            tokenizer._vkv_longest_token = cached
        except AttributeError:  # a tokenizer object that takes no new attributes is measured again next time
            pass
    return max(cached, 1)


def _mark_plain(chats: list[dict[str, Any]], controls: tuple[str, ...]) -> tuple[list[dict[str, Any]], list]:
    """Copies of `chats` in which every message string holding control-token text is replaced by a marker that keeps
    its leading and trailing whitespace (so a template that trims treats both alike), and for each marker the
    string's core and the field it came from."""
    cores: list[tuple[str, str]] = []

    def mark(value: Any, field_path: str) -> Any:
        if isinstance(value, str):
            if not any(c in value for c in controls):
                return value
            core = value.strip()
            lead = value[: len(value) - len(value.lstrip())]
            cores.append((core, field_path))
            return f"{lead}vkvplain{len(cores) - 1:06d}q{value[len(lead) + len(core) :]}"
        if isinstance(value, dict):
            return {mark(k, field_path): mark(v, f"{field_path}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [mark(v, f"{field_path}[{j}]") for j, v in enumerate(value)]
        return value

    marked = []
    for i, chat in enumerate(chats):
        copy = dict(chat)
        for key in ("content", "name", "tool_calls"):
            if key in copy:
                copy[key] = mark(copy[key], f"messages[{i}].{key}")
        marked.append(copy)
    return marked, cores


def plain_ranges(
    fmt: Any, chats: list[dict[str, Any]], text: str, where: str, add_generation_prompt: bool = False
) -> list[tuple[int, int]]:
    """Character ranges of `text` (the template's rendering of `chats` by `fmt`, the tokenizer's ChatFormat) that
    hold a message's own control-token text; empty when no message string holds any (the common case, found without rendering again)."""
    controls = control_strings(fmt.tokenizer)
    if not controls:
        return []
    marked, cores = _mark_plain(chats, controls)
    if not cores:
        return []
    parts = _MARK.split(fmt.render_text(marked, add_generation_prompt=add_generation_prompt))
    ranges: list[tuple[int, int]] = []
    position = len(parts[0])
    fits = text.startswith(parts[0])
    for k in range(1, len(parts), 2):
        if not fits:
            break
        core, field_path = cores[int(parts[k])]
        after = parts[k + 1]
        # the template writes a string as it is, or inside JSON (tool-call arguments) with JSON's escapes
        spellings = (core, json.dumps(core, ensure_ascii=False)[1:-1], json.dumps(core)[1:-1])
        spelled = next((s for s in spellings if text.startswith(s + after, position)), None)
        if spelled is None:
            fits = False
            break
        ranges.append((position, position + len(spelled)))
        position += len(spelled) + len(after)
    if not fits or position != len(text):
        field_path = cores[0][1]
        raise VkvError(
            f"{where}: field {field_path}: holds control-token text and the chat template changes that text when it "
            "renders it, so it cannot be kept as plain text"
        )
    return ranges


def encode(tokenizer, text: str, plain: list[tuple[int, int]], where: str) -> list[int]:
    """Token ids of `text` in which control-token text inside the `plain` character ranges becomes ordinary tokens,
    while control tokens elsewhere (the template's) stay control tokens.

    A tokenizer cuts text at its control tokens and tokenises the pieces between them on their own; this does the
    same, cutting only at the control tokens outside `plain` and tokenising the pieces with special-token text split
    into ordinary tokens. Cutting at every control token must give the tokenizer's own ids, which checks that this
    tokenizer works that way."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not plain:
        return ids
    controls = control_strings(tokenizer)
    found = [m.span() for m in re.finditer("|".join(map(re.escape, controls)), text)] if controls else []
    kept = [(a, b) for a, b in found if not any(a < end and start < b for start, end in plain)]
    if len(kept) == len(found):
        return ids
    if _encode_cut(tokenizer, text, found) != ids:
        raise VkvError(
            f"{where}: a message holds control-token text, and this tokenizer does not tokenise text between its "
            "control tokens piece by piece, so that text cannot be kept as plain text"
        )
    return _encode_cut(tokenizer, text, kept)


def _encode_cut(tokenizer, text: str, cuts: list[tuple[int, int]]) -> list[int]:
    """Ids of `text` cut at the control tokens at `cuts`, each piece between them tokenised as plain text."""
    pieces, position = [], 0
    for a, b in cuts:
        pieces.append(text[position:a])
        position = b
    pieces.append(text[position:])
    present = [p for p in pieces if p]
    encoded = iter(
        tokenizer(present, add_special_tokens=False, split_special_tokens=True)["input_ids"] if present else []
    )
    ids: list[int] = []
    for j, piece in enumerate(pieces):
        if piece:
            ids.extend(next(encoded))
        if j < len(cuts):
            a, b = cuts[j]
            ids.append(tokenizer.convert_tokens_to_ids(text[a:b]))
    return ids
