#!/usr/bin/env bash
# The CLI on a GPU in a few minutes, without the test model's weights: a random tiny Llama with the test model's
# tokenizer (a directory holding tokenizer.json etc., default: the fetched test model) goes through compress (one
# span, per turn, bf16 with a logit offset), inspect, ask, every eval method in fp32, bf16 and 8-bit (bitsandbytes), a
# bench of every method's stages, and a sweep with its report.
# Exits non-zero if any step fails; each failing step prints its last vkv frames.
#   bash scripts/cuda_check.sh [TOKENIZER_DIR]
set -u
cd "$(dirname "$0")/.."
TOK=${1:-${VKV_HOME:-$HOME/.cache/vkv}/models/smollm2-135m}
W=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # vkv from this checkout, installed or not
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
python3 - "$TOK" "$W/tiny" <<'PY' || exit 1
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig
tok = AutoTokenizer.from_pretrained(sys.argv[1])
torch.manual_seed(0)
config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192, tie_word_embeddings=True,
    rope_theta=10000.0, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[2])
tok.save_pretrained(sys.argv[2])
PY
cat > "$W/sweep.toml" <<TOML
name = "cuda-check"
description = "the sweep path with a random tiny model"
[defaults]
model = "$W/tiny"
quant = "fp32"
transcripts = ["$PWD/transcripts/dev/taskapi-express-sqlite.json"]
window = 1024
max_windows = 1
seeds = [0]
[[grid]]
methods = ["full", "none"]
[[grid]]
methods = ["kvzip", "am", "snapkv", "knorm", "vkv"]
ratios = [3.2, 8.0]
TOML
T=transcripts/dev/taskapi-express-sqlite.json
M="--model $W/tiny --quant fp32"
failed=0
step() {
  echo "=== $1"; shift; local t0=$SECONDS
  if "$@" > "$W/step.log" 2>&1; then tail -n 3 "$W/step.log"; echo "=== ok in $((SECONDS - t0)) s"
  else grep -A1 "File \"$PWD/vkv" "$W/step.log" | tail -n 6; tail -n 2 "$W/step.log"; echo "=== FAILED"; failed=1; fi
}
step "compress" python3 -m vkv.cli compress $T $M --window 1024 --ratio 3.2 --steps 2 --out "$W/a.safetensors"
step "inspect" python3 -m vkv.cli inspect "$W/a.safetensors"
step "ask" python3 -m vkv.cli ask "$W/a.safetensors" $M --question "Which library hashes passwords?" --answer-prefix "It uses"
step "compress per turn" python3 -m vkv.cli compress $T $M --window 560 --per-turn --ratio 3.2 --steps 2 --out "$W/s.safetensors"
step "compress bf16, offset" python3 -m vkv.cli compress $T --model "$W/tiny" --quant bf16 --window 1024 --ratio 8 --steps 2 --virtual-offset -2 --out "$W/b.safetensors"
step "eval every method" python3 -m vkv.cli eval $T $M --window 1024 --max-windows 1 --ratio 3.2 --steps 2 \
  --method full,none,truncate,streaming,snapkv,knorm,kvzip,am,meanpool,vkv,kvopt,reuse
step "eval every method, bf16" python3 -m vkv.cli eval $T --model "$W/tiny" --quant bf16 --window 1024 --max-windows 1 \
  --ratio 8 --steps 2 --method full,none,truncate,streaming,snapkv,knorm,kvzip,am,meanpool,vkv,kvopt,reuse
step "eval every method, 8-bit" python3 -m vkv.cli eval $T --model "$W/tiny" --quant 8bit --window 1024 --max-windows 1 \
  --ratio 8 --steps 2 --method full,none,truncate,streaming,snapkv,knorm,kvzip,am,meanpool,vkv,kvopt,reuse
step "eval per turn, bf16" python3 -m vkv.cli eval $T --model "$W/tiny" --quant bf16 --window 1024 --max-windows 1 \
  --ratio 8 --steps 2 --method kvzip,am,vkv --per-turn
step "compress am, 8-bit, save" python3 -m vkv.cli compress $T --model "$W/tiny" --quant 8bit --window 1024 --ratio 8 --method am --out "$W/q.safetensors"
step "bench compress, bf16" python3 -m vkv.cli bench compress --model "$W/tiny" --quant bf16 --device cuda --tokens 1024 \
  --methods kvzip,am,vkv,kvopt --ratio 8 --json "$W/bench.json"
step "eval vkv per turn" python3 -m vkv.cli eval $T $M --window 1024 --max-windows 1 --ratio 3.2 --steps 2 --method vkv,am --per-turn
step "eval vkv verbatim shared" python3 -m vkv.cli eval $T $M --window 1024 --max-windows 1 --ratio 3.2 --steps 2 --method vkv --verbatim shared
step "sweep" python3 -m vkv.cli sweep "$W/sweep.toml" --out "$W/sweep"
step "report" python3 -m vkv.cli report "$W/sweep" --vs kvzip
rm -rf "$W"
exit $failed
