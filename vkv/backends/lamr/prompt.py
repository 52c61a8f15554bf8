"""The reranker prompt around the code, and the split of long code into overlapping token windows.

The prompt is Qwen3-Reranker's chat format (as SWE-Pruner uses it): the code sits between a prefix that
carries the query and a suffix after which the backbone would answer "yes" or "no". Other backbones get
the same text; their tokenizer simply reads the ChatML markers as ordinary text if it lacks them.
"""

from __future__ import annotations

from dataclasses import dataclass

from vkv.errors import VkvError

SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. "
    'Note that the answer can only be "yes" or "no".'
)
INSTRUCT = "Given a query, judge if the document(code) is related to query."
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def prefix_text(query: str) -> str:
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
        f"<Instruct>: {INSTRUCT}\n<Query>: {query}\n<Document>: "
    )


@dataclass(frozen=True)
class CodeTokens:
    """The code tokenised on its own, with each token's character span in the code."""

    ids: list[int]
    offsets: list[tuple[int, int]]


@dataclass(frozen=True)
class Chunk:
    """One backbone input: prefix + a window of code tokens + suffix."""

    input_ids: list[int]
    code_start: int  # position of the first code token in input_ids
    token_start: int  # index of that token in CodeTokens
    token_end: int  # exclusive

    @property
    def code_len(self) -> int:
        return self.token_end - self.token_start


def tokenize_code(tokenizer, code: str) -> CodeTokens:
    encoded = tokenizer(code, add_special_tokens=False, return_offsets_mapping=True)
    offsets = [tuple(span) for span in encoded["offset_mapping"]]
    return CodeTokens(list(encoded["input_ids"]), offsets)


def answer_token_ids(tokenizer) -> tuple[int, int]:
    """Ids of the single tokens "no" and "yes" the relevance head reads."""
    ids = []
    for word in ("no", "yes"):
        token_id = tokenizer.convert_tokens_to_ids(word)
        if token_id is None or token_id == tokenizer.unk_token_id:
            pieces = tokenizer(word, add_special_tokens=False)["input_ids"]
            if len(pieces) != 1:
                raise VkvError(
                    f"the backbone tokenizer has no single token for '{word}', which the relevance head needs"
                )
            token_id = pieces[0]
        ids.append(int(token_id))
    return ids[0], ids[1]


def make_chunks(tokenizer, code_tokens: CodeTokens, query: str, max_length: int, overlap: int) -> list[Chunk]:
    """Windows of code tokens that fit `max_length` with the prompt, consecutive ones sharing `overlap`."""
    prefix = tokenizer(prefix_text(query), add_special_tokens=False)["input_ids"]
    suffix = tokenizer(SUFFIX, add_special_tokens=False)["input_ids"]
    room = max_length - len(prefix) - len(suffix)
    if room <= 2 * overlap:
        raise VkvError(
            f"max_length {max_length} leaves {room} code tokens per chunk after the prompt; "
            f"it must exceed twice the overlap ({overlap}): raise max_length or shorten the query"
        )
    n = len(code_tokens.ids)
    chunks, start = [], 0
    while True:
        end = min(start + room, n)
        ids = prefix + code_tokens.ids[start:end] + suffix
        chunks.append(Chunk(ids, len(prefix), start, end))
        if end >= n:
            return chunks
        start = end - overlap
