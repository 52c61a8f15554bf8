#!/usr/bin/env bash
# The main job on the CPU test model: check the model, then render the reference transcript.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
vkv doctor --model smollm2-135m --quant 8bit
vkv render transcripts/taskapi-express-sqlite.json --model smollm2-135m
