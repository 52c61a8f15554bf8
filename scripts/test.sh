#!/usr/bin/env bash
# Set up and run the whole test suite (unit tests on tiny random models, integration tests on smollm2-135m).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
# style is checked where the tests are: lint and format (settings in pyproject.toml)
ruff check vkv tests scripts
ruff format --check vkv tests scripts
python -m pytest -q "$@"
