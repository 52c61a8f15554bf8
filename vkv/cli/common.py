"""What every command shares: the consoles, model flags and loading, JSON output, small parsers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from vkv.cli.consoles import console
from vkv.cli.consoles import errors as errors  # re-exported: command modules take both consoles from here
from vkv.errors import VkvError
from vkv.io import write_json_atomic
from vkv.progress import status
from vkv.settings import setting, threads_setting
from vkv.text.transcript import load_transcript
from vkv.text.windows import window_transcript


def recorded_transcript(cache_path, header: dict, override: str | None = None):
    """The transcript a cache file was built from (its recorded path, or `override`), checked against the recorded
    hash and cut to the recorded window."""
    recorded = header.get("transcript", {})
    path = override or recorded.get("path")
    if not path:
        raise VkvError(f"{cache_path}: no transcript path recorded; pass --transcript")
    if not override and not Path(path).is_file():
        raise VkvError(
            f"{cache_path}: field transcript.path: the transcript it was built from, {path}, is not there any more; "
            "pass --transcript with its new path (its hash is checked)"
        )
    transcript = load_transcript(path)
    if recorded.get("sha256") not in (None, transcript.sha256):
        raise VkvError(f"{path}: field sha256: this transcript is not the one the cache was built from")
    return window_transcript(transcript, *recorded["window"]) if recorded.get("window") else transcript


def trust_foreign_setting() -> Any:
    """`--trust-foreign`, a field of every command that loads cache files (vkv.kv.sign)."""
    return setting(
        False,
        "load a cache file not signed with your key (another user's, or written before signatures); its digest and "
        "plausibility for the model are still checked",
    )


@dataclass
class OutputFlags:
    """`--force`, added by vkv.cli.build_parser to every command that writes files (its `outputs`)."""

    force: bool = setting(
        False,
        "replace an existing file of another kind (a cache with JSON, a text file with a cache; any file with an "
        "imported transcript or a report.md vkv did not write); never a link, device, input or what vkv keeps",
    )


def _quants() -> tuple[str, ...]:
    from vkv.lm.load import QUANTS

    return QUANTS


@dataclass
class ModelConfig:
    """The model a command loads (`--model`, `--quant`, `--device`, `--attn`); nested in each command's config."""

    model: str | None = setting(
        None,
        "hub id, local directory, or alias (smollm2-135m); default: vkv's default model, or for ask, chat and "
        "validate the one the cache or transcripts record",
    )
    quant: str = setting("auto", "auto = 8bit on CUDA, fp32 on CPU", choices=_quants)
    device: str = setting("auto", "cpu, cuda, cuda:N or auto")
    attn: str = setting("sdpa", "attention implementation", choices=("sdpa", "eager"))
    threads: int | None = threads_setting()


def load_model_from(config: ModelConfig):
    """The model `config` names (vkv's default model when it names none and a GPU can run it), with torch's CPU
    threads set first when `config` gives them."""
    import torch

    from vkv.lm.load import default_model, load_model

    if config.threads:
        torch.set_num_threads(config.threads)
    name = config.model or default_model(config.device)
    with status(f"loading {name} ({config.quant})"):
        return load_model(name, quant=config.quant, device=config.device, attn_implementation=config.attn)


def write_json(path: str | None, obj) -> None:
    """`obj` as JSON to `path`, a command's --json (vkv.io.check_output checked it before the work)."""
    if path:
        write_json_atomic(path, obj, field="--json")
        console.print(f"wrote {path}")


def key_value_table(title: str, rows: dict) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for k, v in rows.items():
        table.add_row(str(k), f"{v:.4g}" if isinstance(v, float) else str(v))
    return table


def parse_list(text: str, cast, what: str) -> list:
    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise VkvError(f"--{what} {text!r}: expected a comma-separated list") from None


def tokenizer_for(name: str | None, device: str = "auto"):
    """The tokenizer of `name` (of vkv's default model when None, where a GPU can run it)."""
    from transformers import AutoTokenizer

    from vkv.lm.load import default_model, resolve_model_path

    name = name or default_model(device)
    path, local = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=local)
    except (OSError, ValueError) as exc:  # ValueError: files there that no installed tokenizer class can read
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise VkvError(f"could not load the tokenizer of '{name}': {reason}") from exc
