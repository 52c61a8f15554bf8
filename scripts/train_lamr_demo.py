"""Train a demonstration LaMR checkpoint on the CPU test model and print the paper's ablation in miniature.

    python scripts/train_lamr_demo.py [--records 600] [--val-records 150] [--epochs 10]

1. builds a synthetic corpus from the standard library (vkv.backends.lamr.corpus; train and validation
   come from disjoint files) and writes it next to the checkpoints;
2. runs the frozen backbone (SmolLM2-135M) once over every example and caches its features;
3. trains two heads on those features: semantic-only (one rubric, SWE-Pruner's architecture, learns the
   teacher's lines) and semantic+dependency (LaMR, fused CRF learns teacher lines + dependency support);
4. evaluates the whole pruning path on validation (Viterbi → line fractions → threshold 0.4 → optional
   AST repair) and prints token precision/recall/F1 against two references: the teacher's evidence lines,
   and evidence + dependency support (what LaMR aims to keep); plus the fraction of kept tokens, how many
   outputs parse, and how often the kept lines change when the same code is asked a different question.
Checkpoints go to $VKV_HOME/lamr-demo/{semantic-only,semantic-dependency}; the latter is the demo model
for `vkv prune --backend lamr --checkpoint ...`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from vkv.backends.lamr.checkpoint import load_checkpoint, read_manifest, save_checkpoint
from vkv.backends.lamr.cli import build_corpus_files
from vkv.backends.lamr.dataset import encode
from vkv.backends.lamr.evaluate import evaluate
from vkv.backends.lamr.labels import LabelConfig
from vkv.backends.lamr.model import LaMRConfig, LaMRModel, build_model
from vkv.backends.lamr.records import read_records
from vkv.backends.lamr.repair import RepairConfig
from vkv.backends.lamr.train import TrainConfig, TrainSummary, fit
from vkv.home import vkv_home


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=vkv_home() / "lamr-demo")
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--backbone-dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--records", type=int, default=600)
    parser.add_argument("--val-records", type=int, default=150)
    parser.add_argument("--max-lines", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--crf-lr-scale",
        type=float,
        default=100.0,
        help="CRF potentials learn this much faster (a few hundred steps, not the paper's ~11k)",
    )
    parser.add_argument("--dropout", type=float, default=0.4)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--threshold", type=float, default=0.4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="load a variant's checkpoint instead of training it when it was trained with these "
        "settings on this corpus (resume after an interruption)",
    )
    args = parser.parse_args()
    console = Console(width=160)  # the table stays readable when the output goes to a log file
    start = time.perf_counter()

    args.out.mkdir(parents=True, exist_ok=True)
    corpus, val_corpus = args.out / "corpus.jsonl", args.out / "val.jsonl"
    built = build_corpus_files(
        corpus,
        val_out=val_corpus,
        records=args.records,
        val_records=args.val_records,
        max_lines=args.max_lines,
        seed=args.seed,
    )
    console.print(
        f"corpus: {built['train']['records']} train records from {built['train']['source_files']} files, "
        f"{built['val']['records']} validation records from {built['val']['source_files']} other files"
    )

    both = LaMRConfig(
        backbone=args.backbone,
        rubrics=("semantic", "dependency"),
        trainable_top_layers=0,
        backbone_dtype=args.backbone_dtype,
        max_length=args.max_length,
        threshold=args.threshold,
        dropout=args.dropout,
    )
    torch.manual_seed(args.seed)
    lamr = build_model(both)
    torch.manual_seed(args.seed)
    semantic_only = LaMRModel(replace(both, rubrics=("semantic",)), lamr.backbone, lamr.tokenizer)
    labels = LabelConfig()
    train_set = encode(lamr.tokenizer, read_records(corpus), both, labels)
    val_set = encode(lamr.tokenizer, read_records(val_corpus), both, labels)
    tokens = sum(len(e.chunk.input_ids) for e in train_set.examples + val_set.examples)
    console.print(f"{len(train_set.examples)} train / {len(val_set.examples)} validation sequences, {tokens} tokens")

    corpus_hash = hashlib.sha256(corpus.read_bytes() + val_corpus.read_bytes()).hexdigest()
    base = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        crf_lr_scale=args.crf_lr_scale,
        bf16_autocast=True,
        seed=args.seed,
    )
    runs = {}
    for name, model, config in [
        ("semantic-only", semantic_only, replace(base, rubric_weights=(1.0,))),
        ("semantic-dependency", lamr, base),
    ]:
        console.rule(name)
        extra = {
            "train_config": asdict(config),
            "label_config": asdict(labels),
            "data": str(corpus),
            "val_data": str(val_corpus),
            "corpus_sha256": corpus_hash,
        }
        reused = _reusable(args.out / name, model, extra) if args.reuse else None
        if reused is not None:
            console.print(f"reusing {args.out / name} (same settings and corpus)")
            model, summary = reused
        else:
            summary = fit(model, train_set, val_set, config, log=console.print)
            save_checkpoint(model, args.out / name, {"training": summary.to_dict(), **extra})
        runs[name] = (model, summary)

    rows = [
        ("semantic only (SWE-Pruner head)", "semantic-only", None),
        ("semantic + dependency (LaMR), no repair", "semantic-dependency", None),
        ("semantic + dependency + AST repair", "semantic-dependency", RepairConfig()),
    ]
    results = []
    for label, run, repair_config in rows:
        model, summary = runs[run]
        scored = evaluate(model, val_set, args.threshold, repair_config, autocast=False)
        results.append(
            {
                "variant": label,
                "fused_target": summary.fused_target,
                "val_token_f1": summary.best_val.get("f1"),
                "teacher": scored.scores["teacher"],
                "support": scored.scores["denoised"],
                "kept_tokens": scored.kept_token_fraction,
                "parses": scored.python_parse_rate,
                "query_sensitivity": scored.query_sensitivity(val_set.records),
            }
        )
    table = Table(
        title=f"LaMR ablation in miniature: {len(val_set.records)} validation records, threshold {args.threshold}"
    )
    for column in (
        "variant",
        "fused target",
        "train-val F1",
        "P/R/F1 vs evidence",
        "P/R/F1 vs evidence+support",
        "kept tokens",
        "parses",
        "query-sensitive",
    ):
        table.add_column(column)
    for r in results:
        table.add_row(
            r["variant"],
            r["fused_target"],
            f"{r['val_token_f1']:.3f}",
            _prf(r["teacher"]),
            _prf(r["support"]),
            f"{r['kept_tokens']:.2f}",
            f"{r['parses']:.2f}",
            _fraction(r["query_sensitivity"]),
        )
    console.print(table)
    minutes = (time.perf_counter() - start) / 60
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_minutes = (usage.ru_utime + usage.ru_stime) / 60
    console.print(
        f"total {minutes:.1f} min wall, {cpu_minutes:.1f} min CPU ({torch.get_num_threads()} threads); "
        f"checkpoints in {args.out}"
    )
    (args.out / "ablation.json").write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(args).items()},
                "minutes": minutes,
                "cpu_minutes": cpu_minutes,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )


def _reusable(directory: Path, model: LaMRModel, extra: dict):
    """(model, summary) from a checkpoint trained with the same model config, training settings and corpus."""
    try:
        _, manifest = read_manifest(directory)
    except Exception:  # absent or unreadable: train instead
        return None
    same = manifest.get("config") == model.config.to_dict() and all(
        json.loads(json.dumps(manifest.get(k))) == json.loads(json.dumps(v)) for k, v in extra.items()
    )
    if not same:
        return None
    loaded, _ = load_checkpoint(directory, model.device)
    return loaded, TrainSummary(**manifest["training"])


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _prf(scores: dict) -> str:
    return f"{scores['precision']:.3f} / {scores['recall']:.3f} / {scores['f1']:.3f}"


if __name__ == "__main__":
    main()
