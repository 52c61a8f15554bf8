"""What `vkv prune --backend lamr`, `vkv lamr build-corpus` and `vkv lamr train` call.

Each function takes plain arguments (the CLI's flags, declared once as the fields of `CorpusCommandConfig` and
`TrainCommandConfig`), does the work, and returns a result object the caller prints; user mistakes raise VkvError
with one sentence naming the file or field.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from vkv.backends.base import PruneResult
from vkv.backends.lamr.checkpoint import save_checkpoint
from vkv.backends.lamr.corpus import CorpusConfig, build_corpus, default_sources, is_validation_file, python_files
from vkv.backends.lamr.dataset import encode
from vkv.backends.lamr.labels import LabelConfig
from vkv.backends.lamr.model import LaMRConfig, build_model
from vkv.backends.lamr.pruner import LaMR, guess_language
from vkv.backends.lamr.records import Record, read_records, write_records
from vkv.backends.lamr.train import TrainConfig, TrainSummary, fit
from vkv.backends.source.languages import language_of_path
from vkv.errors import VkvError
from vkv.io import DEFAULT_SOURCE_MB, SOURCE_LIMIT_ENV, read_input, write_json_atomic
from vkv.lm.load import resolve_device
from vkv.settings import setting


@dataclass
class CorpusCommandConfig:
    """`vkv lamr build-corpus`'s flags; `build_corpus_files` takes them as keywords (its defaults are these)."""

    out: str | None = setting(None, "training records (.jsonl)", required=True)
    val_out: str | None = setting(None, "validation records from disjoint files (.jsonl)")
    sources: tuple[str, ...] | None = setting(None, "directories or files (default: the standard library)", many=True)
    records: int = setting(2000, "training records to build", minimum=1)
    val_records: int = setting(200, "validation records to build", minimum=0)
    val_fraction: float = setting(0.2, "share of source files kept for validation", minimum=0)
    min_lines: int = setting(12, "shortest snippet, in lines", minimum=1)
    max_lines: int = setting(50, "longest snippet, in lines", minimum=1)
    seed: int = setting(0, "seed of the snippet and query choices", minimum=0)


@dataclass
class TrainCommandConfig:
    """`vkv lamr train`'s flags; `train_from_files` takes them as keywords (its defaults are these)."""

    data: str | None = setting(None, "training records (.jsonl)", required=True)
    backbone: str | None = setting(None, "alias, directory or hub id of a decoder LM", required=True)
    out: str | None = setting(None, "checkpoint directory", required=True)
    val_data: str | None = setting(None, "validation records (default: --val-fraction of --data held out)")
    val_fraction: float = setting(0.1, "share of --data held out when --val-data is not given", minimum=0)
    rubrics: tuple[str, ...] = setting(("semantic", "dependency"), "rubric names")
    epochs: int = setting(3, "passes over the training records", minimum=1)
    batch_size: int = setting(16, "records per step", minimum=1)
    lr: float = setting(1e-4, "learning rate", minimum=0, above=True)
    trainable_top_layers: int = setting(2, "0 freezes the backbone (features cached)", minimum=0)
    max_length: int = setting(8192, "longest record, in tokens", minimum=1)
    backbone_dtype: str = setting("float32", "the backbone's weights", choices=("float32", "bfloat16"))
    device: str | None = setting(None, "cpu, cuda or cuda:N (default: cuda when available)")
    seed: int = setting(0, "seed of the hold-out split and the heads' initialisation", minimum=0)


CORPUS = CorpusCommandConfig()
TRAIN = TrainCommandConfig()


def language_for(path: Path, text: str) -> str | None:
    """The language its extension names if LaMR can parse that language; otherwise guessed from the text."""
    language = language_of_path(path)
    return language.name if language is not None and language.grammar is not None else guess_language(text)


def prune_file(
    path: str | Path,
    *,
    checkpoint: str | Path,
    query: str,
    threshold: float | None = None,
    budget: int | None = None,
    ratio: float | None = None,
    language: str | None = None,
    repair: bool = True,
    device: str | None = None,
    backbone: str | None = None,
) -> PruneResult:
    """`vkv prune FILE --backend lamr --checkpoint C --query Q [--threshold 0.4] [--budget N | --ratio R]
    [--language L] [--no-repair] [--device D] [--backbone M]`.

    C is a vkv LaMR checkpoint directory or SWE-Pruner weights (model.safetensors, its directory, or the
    hub id ayanami-kitasan/code-pruner, which needs hub access)."""
    source = Path(path)
    if not source.exists():
        raise VkvError(f"{source} does not exist")
    data = read_input(source, "file to prune", SOURCE_LIMIT_ENV, DEFAULT_SOURCE_MB)  # bounded, regular files only
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise VkvError(f"{source} is not UTF-8 text (byte {exc.start} cannot be decoded)") from exc
    pruner = LaMR.from_checkpoint(checkpoint, device=device, threshold=threshold, repair=repair, backbone=backbone)
    return pruner.prune(text, query, budget=budget, ratio=ratio, language=language or language_for(source, text))


def build_corpus_files(
    out: str | Path,
    *,
    val_out: str | Path | None = None,
    sources: Sequence[str | Path] | None = None,
    records: int = CORPUS.records,
    val_records: int = CORPUS.val_records,
    val_fraction: float = CORPUS.val_fraction,
    min_lines: int = CORPUS.min_lines,
    max_lines: int = CORPUS.max_lines,
    per_file: int = 3,
    queries_per_snippet: int = 2,
    seed: int = CORPUS.seed,
) -> dict:
    """`vkv lamr build-corpus --out corpus.jsonl [--val-out val.jsonl] [--sources DIR...] [--records N]
    [--val-records M] [--val-fraction F] [--min-lines A] [--max-lines B] [--per-file K]
    [--queries-per-snippet Q] [--seed S]`.

    Files are split by a hash of their path (`val_fraction` of them feed validation); without `val_out`
    only the training file is written. Returns counts per split.
    """
    roots = [Path(s) for s in sources] if sources else default_sources()
    files = python_files(roots)
    if not files:
        raise VkvError(f"no Python files found under {', '.join(map(str, roots))}")
    config = CorpusConfig(
        min_lines=min_lines, max_lines=max_lines, per_file=per_file, queries_per_snippet=queries_per_snippet, seed=seed
    )

    def root_of(f: Path) -> Path | None:
        return next((r for r in roots if r.is_dir() and f.is_relative_to(r)), None)

    val_files = [f for f in files if is_validation_file(f, val_fraction, root_of(f))] if val_out else []
    train_files = [f for f in files if f not in set(val_files)]
    val = build_corpus(val_files, val_records, config) if val_out else []
    train = build_corpus(train_files, records, config, exclude_codes={r.code for r in val})
    if not train:
        raise VkvError("the corpus sources produced no training records; give more or larger Python files")
    write_records(out, train)
    summary = {"train": _split_summary(out, train, train_files)}
    if val_out:
        write_records(val_out, val)
        summary["val"] = _split_summary(val_out, val, val_files)
    return summary


def _split_summary(path, records: list[Record], files: list[Path]) -> dict:
    positives = sum(r.score > 0 for r in records)
    return {
        "path": str(path),
        "records": len(records),
        "positives": positives,
        "negatives": len(records) - positives,
        "source_files": len(files),
    }


def train_from_files(
    data: str | Path,
    backbone: str,
    out: str | Path,
    *,
    val_data: str | Path | None = None,
    val_fraction: float = TRAIN.val_fraction,
    rubrics: Sequence[str] = TRAIN.rubrics,
    epochs: int = TRAIN.epochs,
    batch_size: int = TRAIN.batch_size,
    lr: float = TRAIN.lr,
    trainable_top_layers: int = TRAIN.trainable_top_layers,
    max_length: int = TRAIN.max_length,
    backbone_dtype: str = TRAIN.backbone_dtype,
    bf16_autocast: bool = False,
    threshold: float = 0.4,
    target: str | None = None,
    device: str | None = TRAIN.device,
    seed: int = TRAIN.seed,
    log: Callable[[str], None] = print,
    show_progress: bool = True,
) -> TrainSummary:
    """`vkv lamr train --data corpus.jsonl --backbone M --out DIR [--val-data V] [--rubrics semantic,dependency]
    [--epochs 3] [--batch-size 16] [--lr 1e-4] [--trainable-top-layers 2] [--max-length 8192]
    [--backbone-dtype float32] [--bf16-autocast] [--device D] [--seed 0]`.

    Without `val_data`, `val_fraction` of the records (seeded) are held out. Writes the best epoch's
    checkpoint to `out` and returns the summary.
    """
    train_records = read_records(data)
    if val_data is not None:
        val_records = read_records(val_data)
    else:
        train_records, val_records = _hold_out(train_records, val_fraction, seed)
    model_config = LaMRConfig(
        backbone=backbone,
        rubrics=tuple(rubrics),
        trainable_top_layers=trainable_top_layers,
        max_length=max_length,
        backbone_dtype=backbone_dtype,
        threshold=threshold,
    )
    train_config = TrainConfig(
        epochs=epochs, batch_size=batch_size, lr=lr, bf16_autocast=bf16_autocast, target=target, seed=seed
    )
    if len(rubrics) == 1:
        train_config = replace(train_config, rubric_weights=(1.0,))
    train_config.check(model_config.rubrics)
    torch.manual_seed(seed)
    model = build_model(model_config, resolve_device(device))
    label_config = LabelConfig()
    train_set = encode(model.tokenizer, train_records, model_config, label_config)
    val_set = encode(model.tokenizer, val_records, model_config, label_config) if val_records else None
    summary = fit(model, train_set, val_set, train_config, log=log, show_progress=show_progress)
    save_checkpoint(
        model,
        out,
        {
            "training": summary.to_dict(),
            "train_config": asdict(train_config),
            "label_config": asdict(label_config),
            "data": str(data),
        },
    )
    return summary


def _hold_out(records: list[Record], fraction: float, seed: int) -> tuple[list[Record], list[Record]]:
    if not 0.0 <= fraction < 1.0:
        raise VkvError(f"val_fraction must be in [0, 1), got {fraction}")
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    count = int(len(records) * fraction)
    held = set(order[:count])
    return [r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held]


# ---- what `vkv prune --backend lamr` prints -------------------------------------------------------------


def prune_payload(
    path: str | Path,
    *,
    checkpoint: str | Path,
    query: str,
    json_path: str | Path | None = None,
    **options,
) -> dict:
    """`prune_file` (with its keyword `options`) as the payload `vkv prune` prints; also written to `json_path`."""
    result = prune_file(path, checkpoint=checkpoint, query=query, **options)
    payload = {
        "file": str(path),
        "backend": "lamr",
        "query": query,
        "text": result.text,
        "original_tokens": result.original_tokens,
        "compressed_tokens": result.compressed_tokens,
        "ratio_achieved": result.ratio_achieved,
        "kept_lines": result.kept_lines,
        "report": result.report,
    }
    if json_path:
        write_json_atomic(json_path, payload)
    return payload
