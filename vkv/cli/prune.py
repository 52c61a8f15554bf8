"""`vkv prune` and `vkv lamr`: the text-level backends on a source file.

The source file is `vkv prune`'s positional argument (hand-written here: it is not a setting); every flag is a field
of `PruneConfig`, `CorpusCommandConfig` or `TrainCommandConfig`."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from vkv.backends.lamr.cli import (
    CorpusCommandConfig,
    TrainCommandConfig,
    build_corpus_files,
    prune_payload,
    train_from_files,
)
from vkv.backends.longcodezip.cli import prune_file
from vkv.backends.longcodezip.settings import LongCodeZipSettings
from vkv.backends.longcodezip.source import read_source
from vkv.cli.common import ModelConfig, console, load_model_from
from vkv.errors import VkvError
from vkv.progress import status
from vkv.settings import add_arguments, check_ranges, from_args, nested, setting


@dataclass
class PruneConfig:
    """`vkv prune FILE`'s flags: the backend, what to keep, the backend's own options and the model."""

    backend: str | None = setting(None, "the text-level backend", choices=("longcodezip", "lamr"), required=True)
    query: str | None = setting(None, "the request the pruned file must serve", required=True)
    ratio: float | None = setting(None, "original tokens per kept token (≥ 1)", minimum=1)
    budget: int | None = setting(None, "hard cap on the pruned text's tokens", minimum=1)
    language: str | None = setting(None, "override the language detected from the extension")
    rank_only: bool = setting(False, "longcodezip: coarse chunk ranking only")
    checkpoint: str | None = setting(None, "lamr: checkpoint directory")
    threshold: float | None = setting(
        None, "lamr: keep lines scoring at least this (default: the checkpoint's, 0.4)", minimum=0
    )
    repair: bool = setting(True, "lamr: AST-aware repair (--no-repair skips it)")
    model: ModelConfig = nested(ModelConfig)
    json: str | None = setting(None, "also write the pruned text and report here")

    def validate(self) -> PruneConfig:
        """Refuse, in one sentence, flags the chosen backend cannot take together."""
        check_ranges(self)
        if self.backend == "longcodezip" and (self.ratio is None) == (self.budget is None):
            raise VkvError("give exactly one of --ratio or --budget")
        if self.backend == "lamr":
            if self.ratio is not None and self.budget is not None:
                raise VkvError("give at most one of --ratio or --budget (neither: keep lines scoring ≥ --threshold)")
            if not self.checkpoint:
                raise VkvError(
                    "--checkpoint is required for the lamr backend (a vkv LaMR checkpoint directory, or "
                    "SWE-Pruner's model.safetensors)"
                )
        return self


def cmd_prune(args: argparse.Namespace) -> int:
    config = from_args(PruneConfig, args).validate()
    with status(f"pruning {args.file} with {config.backend}"):
        payload = prune(args.file, config)
    console.print(payload["text"], markup=False, highlight=False)
    console.print(
        f"[dim]{payload['original_tokens']} → {payload['compressed_tokens']} tokens "
        f"(ratio {payload['ratio_achieved']:.2f}), {len(payload['kept_lines'])} lines kept[/]"
    )
    return 0


def prune(path: str, config: PruneConfig) -> dict:
    """The payload `vkv prune` prints (pruned text, token counts, kept lines, the backend's report)."""
    what = {"query": config.query, "budget": config.budget, "ratio": config.ratio, "language": config.language}
    # a missing, non-regular, oversized, undecodable or empty file is refused before any model loads
    if not read_source(path).strip():
        raise VkvError(f"{path}: the file to prune is empty (or only whitespace), so there is nothing to prune")
    if config.backend == "longcodezip":
        settings = LongCodeZipSettings(rank_only=config.rank_only)
        lm = load_model_from(config.model)
        return prune_file(path, **what, settings=settings, json_path=config.json, lm=lm)

    lamr = {"threshold": config.threshold, "repair": config.repair, "device": config.model.device}
    return prune_payload(path, checkpoint=config.checkpoint, **what, **lamr, json_path=config.json)


def cmd_lamr(args: argparse.Namespace) -> int:

    if args.lamr_command == "build-corpus":
        summary = build_corpus_files(**asdict(from_args(CorpusCommandConfig, args)))
        for split, counts in summary.items():
            console.print(
                f"{split}: {counts['records']} records ({counts['positives']} relevant, "
                f"{counts['negatives']} not) from {counts['source_files']} files → {counts['path']}"
            )
        return 0
    config = from_args(TrainCommandConfig, args)
    summary = train_from_files(**asdict(config), log=console.print)
    best = summary.best_val.get("f1")
    console.print(
        f"wrote {config.out}: {summary.steps} steps, best validation token F1 "
        f"{'-' if best is None else f'{best:.3f}'} (fused target: {summary.fused_target})"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:

    p = sub.add_parser("prune", help="prune a source file for a query with a text-level backend")
    p.set_defaults(run=cmd_prune, outputs=("json",))
    p.add_argument("file")
    add_arguments(p, PruneConfig)

    p = sub.add_parser("lamr", help="LaMR: build a synthetic training corpus, train a pruner")
    p.set_defaults(run=cmd_lamr)
    lsub = p.add_subparsers(dest="lamr_command", required=True)
    b = lsub.add_parser("build-corpus", help="SWE-Pruner-format records from local Python sources (AST analysis)")
    add_arguments(b, CorpusCommandConfig)
    t = lsub.add_parser("train", help="train LaMR heads (and the top backbone layers) on records")
    add_arguments(t, TrainCommandConfig)
