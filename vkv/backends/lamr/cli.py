"""What `vkv prune --backend lamr`, `vkv lamr build-corpus` and `vkv lamr train` call.

Each function takes plain arguments (the CLI's flags), does the work, and returns a result object the
caller prints; user mistakes raise VkvError with one sentence naming the file or field.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from vkv.backends.base import PruneResult
from vkv.backends.lamr.corpus import CorpusConfig, build_corpus, default_sources, is_validation_file, python_files
from vkv.backends.lamr.labels import LabelConfig
from vkv.backends.lamr.model import LaMRConfig
from vkv.backends.lamr.records import Record, read_records, write_records
from vkv.backends.lamr.train import TrainConfig, TrainSummary
from vkv.backends.source.languages import language_of_path
from vkv.errors import VkvError


def language_for(path: Path, text: str) -> str | None:
    """The language its extension names if LaMR can parse that language; otherwise guessed from the text."""
    from vkv.backends.lamr.pruner import guess_language

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
    from vkv.backends.lamr.pruner import LaMR

    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise VkvError(f"{source} does not exist") from exc
    except UnicodeDecodeError as exc:
        raise VkvError(f"{source} is not UTF-8 text (byte {exc.start} cannot be decoded)") from exc
    pruner = LaMR.from_checkpoint(checkpoint, device=device, threshold=threshold, repair=repair, backbone=backbone)
    return pruner.prune(text, query, budget=budget, ratio=ratio, language=language or language_for(source, text))


def build_corpus_files(
    out: str | Path,
    *,
    val_out: str | Path | None = None,
    sources: Sequence[str | Path] | None = None,
    records: int = 2000,
    val_records: int = 200,
    val_fraction: float = 0.2,
    min_lines: int = 12,
    max_lines: int = 50,
    per_file: int = 3,
    queries_per_snippet: int = 2,
    seed: int = 0,
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
    val_fraction: float = 0.1,
    rubrics: Sequence[str] = ("semantic", "dependency"),
    epochs: int = 3,
    batch_size: int = 16,
    lr: float = 1e-4,
    trainable_top_layers: int = 2,
    max_length: int = 8192,
    backbone_dtype: str = "float32",
    bf16_autocast: bool = False,
    threshold: float = 0.4,
    target: str | None = None,
    device: str | None = None,
    seed: int = 0,
    log: Callable[[str], None] = print,
    show_progress: bool = True,
) -> TrainSummary:
    """`vkv lamr train --data corpus.jsonl --backbone M --out DIR [--val-data V] [--rubrics semantic,dependency]
    [--epochs 3] [--batch-size 16] [--lr 1e-4] [--trainable-top-layers 2] [--max-length 8192]
    [--backbone-dtype float32] [--bf16-autocast] [--device D] [--seed 0]`.

    Without `val_data`, `val_fraction` of the records (seeded) are held out. Writes the best epoch's
    checkpoint to `out` and returns the summary.
    """
    from vkv.backends.lamr.checkpoint import save_checkpoint
    from vkv.backends.lamr.dataset import encode
    from vkv.backends.lamr.model import build_model
    from vkv.backends.lamr.train import fit
    from vkv.lm.load import resolve_device

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
            "train_config": _plain(train_config),
            "label_config": _plain(label_config),
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


def _plain(config) -> dict:
    from dataclasses import asdict

    return asdict(config)


# ---- argparse glue for vkv.cli ------------------------------------------------------------------------------


def run_prune(args) -> dict:
    """`vkv prune FILE --backend lamr ...` from parsed flags; the payload `vkv prune` prints and `--json` keeps."""
    from vkv.io import write_json_atomic

    if not getattr(args, "checkpoint", None):
        raise VkvError(
            "--checkpoint is required for the lamr backend (a vkv LaMR checkpoint directory, or "
            "SWE-Pruner's model.safetensors)"
        )
    result = prune_file(
        args.file,
        checkpoint=args.checkpoint,
        query=args.query,
        threshold=args.threshold,
        budget=args.budget,
        ratio=args.ratio,
        language=args.language,
        repair=not getattr(args, "no_repair", False),
        device=getattr(args, "device", None),
    )
    payload = {
        "file": str(args.file),
        "backend": "lamr",
        "query": args.query,
        "text": result.text,
        "original_tokens": result.original_tokens,
        "compressed_tokens": result.compressed_tokens,
        "ratio_achieved": result.ratio_achieved,
        "kept_lines": result.kept_lines,
        "report": result.report,
    }
    if getattr(args, "json", None):
        write_json_atomic(args.json, payload)
    return payload


def add_lamr_commands(sub):
    """`vkv lamr build-corpus` and `vkv lamr train`; returns the `lamr` parser."""
    p = sub.add_parser("lamr", help="LaMR: build a synthetic training corpus, train a pruner")
    lsub = p.add_subparsers(dest="lamr_command", required=True)
    b = lsub.add_parser("build-corpus", help="SWE-Pruner-format records from local Python sources (AST analysis)")
    b.add_argument("--out", required=True, help="training records (.jsonl)")
    b.add_argument("--val-out", help="validation records from disjoint files (.jsonl)")
    b.add_argument("--sources", nargs="*", help="directories or files (default: the standard library)")
    b.add_argument("--records", type=int, default=2000)
    b.add_argument("--val-records", type=int, default=200)
    b.add_argument("--val-fraction", type=float, default=0.2, help="share of source files kept for validation")
    b.add_argument("--min-lines", type=int, default=12)
    b.add_argument("--max-lines", type=int, default=50)
    b.add_argument("--seed", type=int, default=0)
    t = lsub.add_parser("train", help="train LaMR heads (and the top backbone layers) on records")
    t.add_argument("--data", required=True, help="training records (.jsonl)")
    t.add_argument("--backbone", required=True, help="alias, directory or hub id of a decoder LM")
    t.add_argument("--out", required=True, help="checkpoint directory")
    t.add_argument("--val-data", help="validation records (default: --val-fraction of --data held out)")
    t.add_argument("--val-fraction", type=float, default=0.1)
    t.add_argument("--rubrics", default="semantic,dependency", help="comma-separated rubric names")
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--trainable-top-layers", type=int, default=2, help="0 freezes the backbone (features cached)")
    t.add_argument("--max-length", type=int, default=8192)
    t.add_argument("--backbone-dtype", default="float32", choices=("float32", "bfloat16"))
    t.add_argument("--device", default=None)
    t.add_argument("--seed", type=int, default=0)
    return p


def run_lamr(args, console) -> int:
    if args.lamr_command == "build-corpus":
        summary = build_corpus_files(
            args.out,
            val_out=args.val_out,
            sources=args.sources,
            records=args.records,
            val_records=args.val_records,
            val_fraction=args.val_fraction,
            min_lines=args.min_lines,
            max_lines=args.max_lines,
            seed=args.seed,
        )
        for split, counts in summary.items():
            console.print(
                f"{split}: {counts['records']} records ({counts['positives']} relevant, "
                f"{counts['negatives']} not) from {counts['source_files']} files → {counts['path']}"
            )
        return 0
    rubrics = tuple(r.strip() for r in args.rubrics.split(",") if r.strip())
    summary = train_from_files(
        args.data,
        args.backbone,
        args.out,
        val_data=args.val_data,
        val_fraction=args.val_fraction,
        rubrics=rubrics,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        trainable_top_layers=args.trainable_top_layers,
        max_length=args.max_length,
        backbone_dtype=args.backbone_dtype,
        device=args.device,
        seed=args.seed,
        log=console.print,
    )
    best = summary.best_val.get("f1")
    console.print(
        f"wrote {args.out}: {summary.steps} steps, best validation token F1 "
        f"{'-' if best is None else f'{best:.3f}'} (fused target: {summary.fused_target})"
    )
    return 0
