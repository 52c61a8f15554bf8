#!/usr/bin/env bash
# The main job on the CPU test model: compress a window of the reference transcript into virtual tokens,
# ask the compressed cache a question, then score every method on the same window and print the table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
T=transcripts/dev/taskapi-express-sqlite.json
OUT=${VKV_DEMO_OUT:-runs/demo}
mkdir -p "$OUT"
vkv doctor --model smollm2-135m --quant 8bit
vkv compress "$T" --model smollm2-135m --window 1024 --ratio 3.2 --out "$OUT/taskapi.safetensors" \
    --json "$OUT/compress.json"
vkv inspect "$OUT/taskapi.safetensors"
vkv ask "$OUT/taskapi.safetensors" --model smollm2-135m \
    --question "Which library does the project use for password hashing?" --answer-prefix "The project uses"
vkv eval "$T" --model smollm2-135m --window 1024 --max-windows 1 --ratio 3.2 \
    --method full,none,truncate,streaming,snapkv,knorm,kvzip,am,meanpool,vkv,longcodezip --json "$OUT/eval.json"
