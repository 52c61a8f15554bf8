#!/usr/bin/env bash
# `vkv score` against question-based retention (issue 62): the held-out-continuation score of every method of the long
# benchmark's leaderboard at its ratios, on three of its five long test sessions (the time budget of one session on
# two shared cores), with the same method configs as the benchmark rows they are compared with
# (evals/benchmark-long/results*.jsonl; scripts/score_agreement.py checks the recorded configs match).
# One invocation per session and group, so a stopped run loses at most one file. Method options are flags shared by
# every method of an invocation, so snapkv's rows of the leaderboard (32-token window, tokens shared by all heads) run
# beside truncate and knorm (knorm's default is shared; truncate has no head budget), and kvzip and am (both global by
# default) run on their own. am runs at 8x and 16x on the first two sessions only: on one thread beside other
# processes its first session took 36.5 minutes (25.6 for 8x, with the read-out both ratios share; 9.4 for 16x), so the
# third would not have finished in the session's time; the second ran its ratios one invocation each, to keep 8x if
# 16x could not finish.
#   bash experiments/score-agreement.sh            # then
#   python scripts/score_agreement.py evals/score-agreement/*.json > evals/score-agreement/agreement.md
set -euo pipefail
out=evals/score-agreement
sessions=(gen-long-bug-hunt-8 gen-long-ci-failure-9 gen-long-dependency-upgrade-13)
score() { python -m vkv.cli score "transcripts/long/test/$1.json" --model smollm2-135m --threads 1 "${@:2}"; }
for s in "${sessions[@]}"; do
  score "$s" --method full,none,truncate,knorm,snapkv --head-budget shared --snapkv-window 32 --ratio 3.2,8,16 \
    --json "$out/cheap-$s.json"
  score "$s" --method kvzip --ratio 3.2,8,16 --json "$out/kvzip-$s.json"
done
score gen-long-bug-hunt-8 --method am --ratio 8,16 --json "$out/am-gen-long-bug-hunt-8.json"
score gen-long-ci-failure-9 --method am --ratio 8 --json "$out/am-gen-long-ci-failure-9.json"
score gen-long-ci-failure-9 --method am --ratio 16 --json "$out/am16-gen-long-ci-failure-9.json"
