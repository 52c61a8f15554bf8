"""Shared fixtures: tiny random models (seconds) and the real CPU test model, loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vkv.lm import zoo
from vkv.lm.frozen import FrozenLM
from vkv.lm.load import load_model

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
TEST_MODEL = "smollm2-135m"


@pytest.fixture(scope="session", autouse=True)
def temporary_home(tmp_path_factory):
    """A temporary $VKV_HOME for the whole run, so that the cache signing key the tests make (vkv.kv.sign) and any
    other state they write never touch the user's; the fetched models and LaMR demo checkpoints are linked in."""
    from vkv.home import vkv_home

    real, home = vkv_home(), tmp_path_factory.mktemp("vkv-home")
    (real / "models").mkdir(parents=True, exist_ok=True)  # a model fetched during the run is kept for the next
    for shared in ("models", "lamr-demo"):
        if (real / shared).exists():
            (home / shared).symlink_to(real / shared)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VKV_HOME", str(home))
        yield home


@pytest.fixture(scope="session")
def test_model_dir() -> Path:
    """The converted test model; fetched on first use so the suite needs no hidden setup step."""
    return zoo.fetch(TEST_MODEL, log=lambda *_: None)


@pytest.fixture(scope="session")
def smol_tokenizer(test_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(test_model_dir)


@pytest.fixture(scope="session")
def smol(test_model_dir) -> FrozenLM:
    return load_model(TEST_MODEL, quant="fp32", device="cpu")


@pytest.fixture(scope="session")
def smol8(test_model_dir) -> FrozenLM:
    return load_model(TEST_MODEL, quant="8bit", device="cpu")


def build_tiny(arch: str, tokenizer, seed: int = 0, layers: int = 3) -> FrozenLM:
    """A random model of the given architecture, small enough for unit tests."""
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    torch.manual_seed(seed)
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    configs = {
        "llama": lambda: LlamaConfig(**common, rope_theta=10000.0),
        "qwen2": lambda: Qwen2Config(**common),
        "qwen3": lambda: Qwen3Config(**common, head_dim=16),  # q/k RMS norms per head
        "mistral": lambda: MistralConfig(**common, sliding_window=None),
    }
    config = configs[arch]()
    model = AutoModelForCausalLM.from_config(config).float()
    return FrozenLM(model, tokenizer, name=f"tiny-{arch}", quant="fp32", device=torch.device("cpu"))


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny(request, smol_tokenizer) -> FrozenLM:
    return build_tiny(request.param, smol_tokenizer)


@pytest.fixture(scope="session")
def tiny_llama(smol_tokenizer) -> FrozenLM:
    return build_tiny("llama", smol_tokenizer)


@pytest.fixture
def mini_transcript_path() -> Path:
    return FIXTURES / "mini-agent.json"


def bundled_transcripts() -> list[Path]:
    return sorted((ROOT / "transcripts").glob("*/*.json"))


@pytest.fixture(scope="session")
def tiny_lamr_checkpoint(tiny_llama, tmp_path_factory) -> Path:
    """An untrained two-rubric LaMR checkpoint on a saved tiny backbone: the eval matrix's `lamr` runs on it."""
    from vkv.backends.lamr import LaMRConfig, build_model, save_checkpoint

    root = tmp_path_factory.mktemp("tiny-lamr")
    tiny_llama.model.save_pretrained(root / "backbone")
    tiny_llama.tokenizer.save_pretrained(root / "backbone")
    torch.manual_seed(0)
    model = build_model(
        LaMRConfig(
            backbone=str(root / "backbone"), rubrics=("semantic", "dependency"), trainable_top_layers=0, max_length=512
        )
    )
    return save_checkpoint(model, root / "checkpoint")


def shared_mass(segment):
    """The tokens each entry stands for, from a proportional-attention bias (shared by all layers and KV heads)."""
    if segment.bias is None:
        return None
    assert torch.equal(segment.bias, segment.bias[:1, :1].expand_as(segment.bias)), "the bias is not shared"
    return segment.bias[0, 0].exp().round()


def random_readout(seed=0, rows=4, m=96, n=40, dim=16):
    """A SpanReadout of random queries (scaled down), keys and values, `rows` rows of m queries over n entries."""
    from vkv.compress.compaction import SpanReadout

    g = torch.Generator().manual_seed(seed)
    return SpanReadout(
        torch.randn(rows, m, dim, generator=g) * 0.5,
        torch.randn(rows, n, dim, generator=g),
        torch.randn(rows, n, dim, generator=g),
    )
