"""`vkv inspect`: a cache file's metadata and segment table.

The cache file is the positional argument (hand-written: it is not a setting); every flag is a field of
`InspectConfig`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from rich.table import Table

from vkv.cli.common import console, key_value_table, trust_foreign_setting, write_json
from vkv.kv.file import integrity, read_header, verify
from vkv.kv.report import entries_per_head, entries_text, memory_text, report_rows, report_table, storage
from vkv.settings import add_arguments, from_args, setting


@dataclass
class InspectConfig:
    report: bool = setting(False, "also print the per-turn compression report")
    header_only: bool = setting(False, "read the header alone (by default every tensor is checked against it first)")
    json: str | None = setting(None, "also write the header here")
    trust_foreign: bool = trust_foreign_setting()


def cmd_inspect(args: argparse.Namespace) -> int:

    config = from_args(InspectConfig, args)
    header = read_header(args.cache) if config.header_only else verify(args.cache, config.trust_foreign)
    stored = storage(args.cache, header)
    if not config.header_only:  # each head's entries are counted from the masks the tensors hold
        stored.update(entries_per_head(args.cache, header, config.trust_foreign))
    meta = {k: v for k, v in header.items() if k not in ("segments", "config", "spec", "transcript")}
    meta["integrity"] = "not checked (--header-only)" if config.header_only else integrity(header)
    meta.update({f"transcript.{k}": v for k, v in header.get("transcript", {}).items()}, **stored)
    console.print(key_value_table(f"{args.cache}", meta))
    table = Table(title="segments")
    for col in ("#", "kind", "span", "tokens", "entries", "ratio", "in memory", "loss init→best", "steps"):
        table.add_column(col)
    for i, (seg, row) in enumerate(zip(header["segments"], report_rows(header))):
        st = seg.get("stats", {})
        loss = f"{st['initial_loss']:.4f}→{st['best_loss']:.4f}" if st.get("best_loss") is not None else "—"
        span = seg["span"]
        table.add_row(
            str(i),
            seg["kind"],
            f"{span[0]}–{span[1]}",
            str(span[1] - span[0]),
            entries_text(row),
            f"{seg['ratio']:.2f}",
            memory_text(row),
            loss,
            str(st.get("steps", "—")),
        )
    console.print(table)
    if any(seg.get("stats", {}).get("turn") is not None for seg in header["segments"]) or config.report:
        console.print(report_table(report_rows(header)))
    if config.json:
        write_json(config.json, {**header, "storage": stored})
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="print a cache file's metadata and segment table")
    p.set_defaults(run=cmd_inspect, outputs=("json",))
    p.add_argument("cache")
    add_arguments(p, InspectConfig)
