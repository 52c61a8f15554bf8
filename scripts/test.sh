#!/usr/bin/env bash
# Set up and run the whole test suite (unit tests on tiny random models, integration tests on smollm2-135m).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
python -m pytest -q "$@"
