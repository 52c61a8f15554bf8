#!/usr/bin/env bash
# Create .venv with vkv and its dependencies (CPU torch from this machine's disk), then fetch the test model.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first and pinned: an open range would pull a multi-GB CUDA build; 2.13.0 is the CPU build on disk here.
python -m pip install -q "torch==${VKV_TORCH_VERSION:-2.13.0}"
# transformers pinned too: a fresh machine takes the newest release, and 5.24 changed an argument vkv passes.
python -m pip install -q "transformers==${VKV_TRANSFORMERS_VERSION:-5.24.0}"
python -m pip install -q -e ".[test,plots]"
vkv models fetch smollm2-135m
vkv --help > /dev/null  # writes the parser's description once, so the first command after setup starts fast
