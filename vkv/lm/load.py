"""Load a causal LM frozen, in the precision asked for, on the device asked for."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
from transformers.utils import logging as hf_logging

from vkv.errors import VkvError
from vkv.lm import zoo
from vkv.lm.frozen import FrozenLM

if TYPE_CHECKING:
    from vkv.lm.frozen import FrozenLM

DEFAULT_MODEL = "Qwen/Qwen2.5-Coder-7B-Instruct"
SMALL_MODEL = "smollm2-135m"  # the CPU test model (vkv.lm.zoo)


class _DropBitsandbytesNoise(logging.Filter):
    """bitsandbytes logs on every int8 matmul that fp32 inputs are cast to fp16 (expected on CPU), and at
    import that an optional 4-bit CPU kernel package is absent; both flood the output without news."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not msg.startswith(("MatMul8bitLt: inputs will be cast", "Failed to load CPU gemm_4bit_forward"))


for _name in ("bitsandbytes.autograd._functions", "bitsandbytes.backends.cpu.ops"):
    logging.getLogger(_name).addFilter(_DropBitsandbytesNoise())
QUANTS = ("auto", "8bit", "4bit", "bf16", "fp16", "fp32")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")  # never flash_attention_2: it infers packing from position ids


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as exc:
        raise VkvError(f"unknown device '{device}' (use cpu, cuda, cuda:N or auto)") from exc
    if resolved.type not in ("cpu", "cuda"):  # e.g. meta holds no weights, so nothing could run on it
        raise VkvError(f"--device {device}: vkv runs models on cpu or cuda devices (cpu, cuda, cuda:N or auto)")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise VkvError(f"device '{device}' was requested but CUDA is not available on this machine")
    return resolved


def default_model(device: str | None = None) -> str:
    """The model to load when none is named: DEFAULT_MODEL, refused in one sentence where it would run on the CPU
    (a 7B download and hours of CPU time are never what forgetting --model meant)."""
    if resolve_device(device).type != "cuda":
        raise VkvError(
            f"no --model given, and vkv's default model ({DEFAULT_MODEL}, 7B parameters) needs a GPU, which "
            f"{'--device ' + device + ' rules out' if device not in (None, 'auto') else 'this machine lacks'}: "
            f"pass --model {SMALL_MODEL} (the small CPU test model; `vkv models list` shows the others) or another model"
        )
    return DEFAULT_MODEL


def resolve_quant(quant: str, device: torch.device) -> str:
    if quant not in QUANTS:
        raise VkvError(f"unknown quantisation '{quant}'; choose one of {', '.join(QUANTS)}")
    if quant == "auto":
        return "8bit" if device.type == "cuda" else "fp32"
    return quant


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")  # one is enough to load one
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
HUB_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*")  # [owner/]name, as the Hugging Face hub spells them


def resolve_model_path(name: str) -> tuple[str, bool]:
    """Map an alias, a directory or a hub id to what from_pretrained takes; second item: is it local."""
    if name in zoo.ZOO:
        if not zoo.is_fetched(name):
            raise VkvError(f"model '{name}' is not fetched yet; run `vkv models fetch {name}` first")
        return str(zoo.model_path(name)), True
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise VkvError(f"model directory {path} has no config.json")
        if not any((path / f).is_file() for f in TOKENIZER_FILES):  # every command needs the tokenizer first
            raise VkvError(f"model directory {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
        return str(path), True
    if not HUB_ID.fullmatch(name):  # dots are allowed: Qwen/Qwen2.5-Coder-7B-Instruct
        raise VkvError(f"unknown model '{name}': not an alias ({', '.join(zoo.ZOO)}), a directory, or a hub id")
    if "/" not in name and not _in_hub_cache(name):  # most likely a misspelled alias: say so now, not after retries
        raise VkvError(
            f"unknown model '{name}': not an alias ({', '.join(zoo.ZOO)}), a directory, or a downloaded model; "
            "hub ids are owner/name"
        )
    return name, False


def model_directory(name: str) -> str | None:
    """The directory `name`'s files are read from: an alias's or a local directory, or a hub id's snapshot in the
    Hugging Face cache (whose weights are links to blobs beside it); None for a hub id not downloaded yet."""
    path, local = resolve_model_path(name)
    if local:
        return path
    try:
        config = try_to_load_from_cache(name, "config.json")
    except Exception:  # an id the hub library refuses is not in its cache either
        return None
    return str(Path(config).parent) if isinstance(config, str) else None


def _in_hub_cache(name: str) -> bool:
    """Whether the Hugging Face cache already holds `name`'s config (so it loads without the network)."""
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an id the hub library refuses is not in its cache either
        return False


def load_model(
    name: str = DEFAULT_MODEL,
    quant: str = "auto",
    device: str | None = None,
    attn_implementation: str = "sdpa",
) -> FrozenLM:
    """Load `name` (hub id, directory or alias) frozen, quantised as asked, on `device`."""
    if attn_implementation not in ATTENTION_IMPLEMENTATIONS:
        raise VkvError(f"attention implementation '{attn_implementation}' is not supported; use sdpa or eager")
    dev = resolve_device(device)
    q = resolve_quant(quant, dev)
    path, local = resolve_model_path(name)
    if local and not any(any(Path(path).glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise VkvError(f"model directory {path} has no weights (no .safetensors or .bin file)")
    start = time.perf_counter()
    kwargs: dict[str, Any] = dict(attn_implementation=attn_implementation, local_files_only=local)
    kwargs.update(_quant_kwargs(q, dev))
    hf_logging.disable_progress_bar()  # callers show their own status; per-tensor bars drown it
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except Exception as exc:
        if not isinstance(exc, (OSError, ValueError)) and type(exc).__name__ != "SafetensorError":
            raise
        where = "directory" if local else "hub id (not available offline or in the Hugging Face cache)"
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise VkvError(f"{path}: could not load model '{name}' as a {where}: {reason}") from exc
    if q not in ("8bit", "4bit"):
        model.to(dev)
    return FrozenLM(model, tokenizer, name=name, quant=q, device=dev, load_seconds=time.perf_counter() - start)


def _quant_kwargs(quant: str, device: torch.device) -> dict[str, Any]:
    if quant in ("8bit", "4bit"):
        compute = torch.float32 if device.type == "cpu" else torch.bfloat16
        if quant == "8bit":
            bnb = BitsAndBytesConfig(load_in_8bit=True)
        else:
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute)
        dtype = torch.float32 if device.type == "cpu" else torch.float16
        return dict(quantization_config=bnb, dtype=dtype, device_map={"": str(device)})
    return dict(dtype={"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[quant])
