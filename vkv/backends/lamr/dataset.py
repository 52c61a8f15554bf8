"""Records → backbone inputs with per-token targets, and (for a frozen backbone) cached backbone features.

A token's target for a line-level label is 1 when any of its characters (line ending included) lies on a
labelled line, as in SWE-Pruner. Every target kind (teacher, semantic, dependency, denoised) is stored so
models trained on different targets can share one encoding and one feature cache.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch

from vkv.backends.lamr.inference import pad_batch
from vkv.backends.lamr.labels import TARGETS, LabelConfig, RubricLabels, rubric_labels
from vkv.backends.lamr.model import LaMRConfig, RerankerBackbone
from vkv.backends.lamr.prompt import Chunk, CodeTokens, make_chunks, tokenize_code
from vkv.backends.lamr.records import Record
from vkv.backends.source.lines import LineIndex


@dataclass
class Example:
    """One chunk of one record."""

    record: int
    chunk: Chunk
    targets: dict[str, list[int]]  # target kind → 0/1 per code token of the chunk
    score: float
    features: torch.Tensor | None = None  # [T, width] cached backbone features
    answer_logits: torch.Tensor | None = None  # [2]


@dataclass
class EncodedSet:
    records: list[Record]
    labels: list[RubricLabels]
    tokens: list[CodeTokens]
    examples: list[Example] = field(default_factory=list)

    @property
    def cached(self) -> bool:
        return bool(self.examples) and all(e.features is not None for e in self.examples)


def token_targets(code: str, tokens: CodeTokens, line_labels: list[int]) -> list[int]:
    index = LineIndex.of(code)
    targets = []
    for start, end in tokens.offsets:
        if end <= start or not index.lines:
            targets.append(0)
            continue
        first = bisect.bisect_right(index.starts, start) - 1
        last = bisect.bisect_right(index.starts, end - 1) - 1
        targets.append(int(any(line_labels[i] for i in range(first, last + 1))))
    return targets


def encode(
    tokenizer, records: list[Record], model_config: LaMRConfig, label_config: LabelConfig = LabelConfig()
) -> EncodedSet:
    labels, tokens, examples = [], [], []
    for index, record in enumerate(records):
        label = rubric_labels(record.code, record.kept_lines, record.score, record.language, label_config)
        code_tokens = tokenize_code(tokenizer, record.code)
        per_token = {kind: token_targets(record.code, code_tokens, label.target(kind)) for kind in TARGETS}
        chunks = make_chunks(tokenizer, code_tokens, record.query, model_config.max_length, model_config.chunk_overlap)
        for chunk in chunks:
            window = slice(chunk.token_start, chunk.token_end)
            examples.append(Example(index, chunk, {k: v[window] for k, v in per_token.items()}, record.score))
        labels.append(label)
        tokens.append(code_tokens)
    return EncodedSet(list(records), labels, tokens, examples)


@torch.no_grad()
def cache_features(
    backbone: RerankerBackbone, encoded: EncodedSet, pad_id: int, batch_size: int = 4, progress=None
) -> None:
    """Run the frozen backbone once per example and keep its features (in the backbone's dtype)."""
    storage = next(backbone.model.parameters()).dtype  # features are exact in the dtype they came from
    device = next(backbone.model.parameters()).device
    order = sorted(range(len(encoded.examples)), key=lambda i: len(encoded.examples[i].chunk.input_ids))
    for start in range(0, len(order), batch_size):
        batch = [encoded.examples[i] for i in order[start : start + batch_size]]
        ids, attention = pad_batch([e.chunk.input_ids for e in batch], pad_id, device)
        out = backbone(ids, attention)
        for row, example in enumerate(batch):
            length = len(example.chunk.input_ids)
            example.features = out.features[row, :length].to("cpu", storage).clone()
            example.answer_logits = out.answer_logits[row].to("cpu", torch.float32).clone()
        if progress is not None:
            progress(len(batch))
