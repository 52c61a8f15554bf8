"""Write tests/fixtures/am-tiny-reference.safetensors: attention matching's compactions of the tiny test model's
mini-agent span (ratio 8) in four variants, as the row-by-row float64 solvers computed them before the fit was
batched on the model's device; tests/test_am_batched.py holds today's fit to them. Run from the repository root:
`python scripts/am_fixture.py` (it overwrites the fixture: only to record a deliberate change of results)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.am_fixture_cases import CASES, tiny_work  # noqa: E402
from vkv.compress.attention_matching import AttentionMatchingFit  # noqa: E402
from vkv.compress.budget import span_budget  # noqa: E402


def main() -> None:
    work = tiny_work()
    tensors = {}
    for name, options in CASES.items():
        torch.manual_seed(0)
        result, _ = AttentionMatchingFit(**options).compaction(work, span_budget(work.span_length, 8.0))
        for field in ("index", "bias", "values", "real"):
            tensors[f"{name}.{field}"] = getattr(result, field).contiguous()
    save_file(tensors, str(ROOT / "tests" / "fixtures" / "am-tiny-reference.safetensors"))


if __name__ == "__main__":
    main()
