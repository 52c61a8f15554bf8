#!/usr/bin/env bash
# Create .venv-kvpress for scripts/crosscheck_kvpress.py: NVIDIA kvpress 0.5.5 beside vkv's .venv, in its own venv
# because kvpress 0.5.5 pins transformers < 5.3 and vkv runs on 5.24 (setup.sh).
#
# vkv is NOT installed here: on transformers 5.2 it fails before scoring anything (its RaggedLayer cache lacks an
# abstract method, get_max_cache_shape, that 5.2's cache layers require), so the kvpress side
# (scripts/kvpress_side.py) imports only torch, transformers and kvpress, and vkv scores its choices from .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-kvpress
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip
# torch first and pinned: an open range would pull a multi-GB CUDA build; 2.13.0 is the CPU build on disk here.
pip install -q "torch==${VKV_TORCH_VERSION:-2.13.0}"
# kvpress 0.5.5 allows transformers >=4.56,<5.3; 5.2.x is the newest it takes. Its other pins (datasets, pandas,
# accelerate, peft, ...) come with it.
pip install -q "kvpress==0.5.5" "transformers~=5.2.0"
"$VENV/bin/python" - <<'PY'
from importlib.metadata import version
import kvpress  # noqa: F401  (fails here, not in the middle of a cross-check, if the install is broken)
print(f"{__import__('sys').prefix}: " + ", ".join(f"{p} {version(p)}" for p in ("kvpress", "transformers", "torch")))
PY
