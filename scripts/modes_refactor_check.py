"""The tiny model's half of a refactor check: every KV method whole and per turn, and vkv's modes, compress the
fixture conversation on the tiny random llama, each written as a cache file; a second call compares two such folders
tensor by tensor. Run it at the commit before a refactor (from a worktree) and after it:

    PYTHONPATH=<old worktree> python scripts/modes_refactor_check.py write runs/tiny-old
    python scripts/modes_refactor_check.py write runs/tiny-new
    python scripts/modes_refactor_check.py compare runs/tiny-new runs/tiny-old      # exits 1 on a difference

vkv's modes are spelled as the code at hand spells them in Python (`per_turn=True` on both sides; one set of verbatim
tokens for every head as `keep_verbatim=True` before vkv's modes became fields, `verbatim="shared"` after)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

RATIO = 3.2
TOLERANCE = 1e-5
ORACLE = "oracle"  # vkv's loop targets as every version before online became the default had them


def cases(methods, text_method) -> dict[str, tuple[str, dict]]:
    """Every KV method with a budget, whole and (where it has the mode) per turn, and vkv's modes, by a case name."""
    import vkv

    fast = vkv.CompressConfig(optim=vkv.OptimConfig(steps=2))
    recipe_class = getattr(vkv, "VkvRecipe", None)

    def vkv_options(per_turn: bool, shared: bool, share: float | None = None) -> dict:
        compress = fast if share is None else vkv.CompressConfig(verbatim_share=share, optim=fast.optim)
        if recipe_class is None:  # before vkv's modes were fields
            options = {"recipe": compress, "per_turn": per_turn, "keep_verbatim": shared}
            if per_turn:
                options = {"recipe": vkv.MultiTurnConfig(compress, keep_verbatim=shared), "per_turn": True}
            return options
        verbatim = "shared" if shared else ("none" if share == 0 else None)
        return {"recipe": recipe_class(compress, verbatim=verbatim, target_source=ORACLE), "per_turn": per_turn}

    out = {}
    for name, cls in methods.items():
        if cls.reference or issubclass(cls, text_method) or name in ("vkv", "sequential", "hybrid", "reuse"):
            continue
        options = {"recipe": fast} if "recipe" in cls.option_names() else {}
        out[name] = (name, options)
        if "per_turn" in cls.option_names() and name != "meanpool":
            out[f"{name}-per-turn"] = (name, {**options, "per_turn": True})
    for per_turn in (False, True):
        words = "-per-turn" if per_turn else ""
        out[f"vkv{words}"] = ("vkv", vkv_options(per_turn, False))
        out[f"vkv{words}-shared"] = ("vkv", vkv_options(per_turn, True))
        out[f"vkv{words}-none"] = ("vkv", vkv_options(per_turn, False, 0.0))
        modes = getattr(sys.modules.get("vkv.compress.recipe"), "VERBATIM_MODES", ())
        if "shared+per-head" in modes:  # the two verbatim parts together, where the code has the mode
            recipe = recipe_class(
                vkv.CompressConfig(verbatim_share=0.5, optim=fast.optim),
                verbatim="shared+per-head",
                target_source=ORACLE,
            )
            out[f"vkv{words}-shared+per-head"] = ("vkv", {"recipe": recipe, "per_turn": per_turn})
    return out


def write(folder: Path) -> int:
    from transformers import AutoTokenizer

    from tests.conftest import FIXTURES, build_tiny

    try:
        from vkv.api.compress import _kv_method, compress_with
    except ImportError:  # before the Python API was a layer of its own
        from vkv.compress_api import _kv_method, compress_with
    from vkv.kv.file import save_cache
    from vkv.lm.zoo import model_path
    from vkv.methods import METHODS
    from vkv.methods.base import TextMethod
    from vkv.text.transcript import load_transcript

    lm = build_tiny("llama", AutoTokenizer.from_pretrained(model_path("smollm2-135m")))
    transcript = load_transcript(FIXTURES / "mini-agent.json")
    folder.mkdir(parents=True, exist_ok=True)
    for case, (name, options) in cases(METHODS, TextMethod).items():
        method = _kv_method(name, dict(options))
        spliced = compress_with(lm, transcript, transcript.default_span(), method, RATIO, seed=0)
        save_cache(spliced, folder / f"{case}.safetensors")
        print(f"{case}: {len(spliced.segments)} segments", file=sys.stderr)
    return 0


def compare(new: Path, old: Path) -> int:
    """1 when a cache both folders hold differs, or one the old folder holds is gone; a mode only the new code has is
    listed, not counted."""
    differ = 0
    names = sorted(p.name for p in old.glob("*.safetensors"))
    for name in sorted(p.name for p in new.glob("*.safetensors") if not (old / p.name).exists()):
        print(f"new   {name} (no counterpart in {old})")
    for name in names:
        if not (new / name).exists():
            print(f"GONE  {name} (only in {old})")
            differ += 1
            continue
        a, b = load_file(new / name), load_file(old / name)
        worst = max((float((a[k].double() - b[k].double()).abs().max()) for k in a if k in b), default=0.0)
        same = set(a) == set(b) and all(a[k].shape == b[k].shape for k in a) and worst <= TOLERANCE
        differ += not same
        print(f"{'same' if same else 'DIFF'}  {name}: {len(a)} tensors, max |Δ| {worst:.2e}")
    print(f"{len(names) - differ} of {len(names)} caches identical to {TOLERANCE:g}")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("write").add_argument("folder", type=Path)
    both = sub.add_parser("compare")
    both.add_argument("new", type=Path)
    both.add_argument("old", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    return write(args.folder) if args.command == "write" else compare(args.new, args.old)


if __name__ == "__main__":
    sys.exit(main())
