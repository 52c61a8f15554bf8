#!/usr/bin/env bash
# The main job on the CPU test model: compress a window of the reference transcript (by Attention Matching, vkv's
# default), ask the compressed cache a question, then score the main methods on one window and say what the numbers
# mean. Measured after setup (the first setup downloads torch and the model): 3.6 minutes of wall time with one thread
# (OMP_NUM_THREADS=1) on 2 CPU cores shared with 4 other busy processes (load 9), 1.8 minutes of CPU time, so about
# 2 minutes on 2 idle cores (estimated; no idle machine was at hand to measure it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
T=transcripts/dev/taskapi-express-sqlite.json
OUT=${VKV_DEMO_OUT:-runs/demo}
mkdir -p "$OUT"
SECONDS=0
vkv doctor --model smollm2-135m --quant 8bit
# turns 8-9 (the third 512-token window with questions): the project drops `bcrypt` for `bcryptjs`
vkv compress "$T" --model smollm2-135m --window 512 --window-index 2 --ratio 3.2 --out "$OUT/taskapi.safetensors" \
    --json "$OUT/compress.json"
vkv inspect "$OUT/taskapi.safetensors"
vkv ask "$OUT/taskapi.safetensors" --model smollm2-135m \
    --question "Which library does the project use for password hashing?" --answer-prefix "The project uses"
# the 768-token window with the most questions (turns 12-14: 6 questions on the project's configuration)
vkv eval "$T" --model smollm2-135m --window 768 --max-windows 1 --ratio 3.2 \
    --method full,none,truncate,streaming,snapkv,knorm,kvzip,am,meanpool,vkv --json "$OUT/eval.json"
cat <<EOF

What the numbers mean ($SECONDS s after setup; the tables' full rows: $OUT/eval.json):
- ask: the answer read from the compressed cache alone, which keeps 1 entry per KV head for every 3.2 tokens of
  turns 8-9 (the system message stays whole); "bcryptjs" is right (in turn 8 the project drops "bcrypt", wrong).
- eval asks each question after the window, compressed by each method to 3.2 tokens per entry ("achieved"), and
  scores the answer against the references full (the whole window kept) and none (nothing kept, positions kept):
  retention = (log p_method - log p_none) / (log p_full - log p_none) of the correct answer, the share of the
  window's evidence the method keeps (1: all of it; 0: as if the window were gone; above 1 or below 0 happens);
  choice acc: the correct choice is the most likely of the question's choices; keyword acc: the greedy answer names
  an accepted keyword; recall kept: of the facts the model quotes with the full window (a cloze of the line that
  states each), the share it still quotes (of N: how many it quotes with the full window); fidelity KL: KL(full ||
  method) over the question and answer (0: same predictions as full); seconds: the compression's wall time.
- One window of 6 questions is a smoke test, not a result: evals/RESULTS.md and the README's results table rest on
  the test split's whole sessions with bootstrap intervals.
EOF
