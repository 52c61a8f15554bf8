#!/usr/bin/env bash
# `vkv score` against question-based retention (issue 62): the held-out-continuation score of every method of the long
# benchmark's leaderboard at its ratios, on three of its five long test sessions (the time budget of one session on
# two shared cores), with the same method configs as the benchmark rows they are compared with
# (evals/benchmark-long/results*.jsonl; scripts/score_agreement.py checks the recorded configs match).
# One invocation per session and group, so a stopped run loses at most one file. Method options are flags shared by
# every method of an invocation, so snapkv's rows of the leaderboard (32-token window, tokens shared by all heads) run
# beside truncate and knorm (knorm's default is shared; truncate has no head budget), and kvzip and am (both global by
# default) run on their own. am runs at 8x and 16x only, on the first two sessions: on one thread beside other
# processes its first session took about 25 minutes (a 9-minute read-out shared by both ratios, then each fit), so the
# third would not have finished in the session's time.
#   bash experiments/score-agreement.sh            # then
#   python scripts/score_agreement.py evals/score-agreement/*.json
set -euo pipefail
out=evals/score-agreement
sessions=(gen-long-bug-hunt-8 gen-long-ci-failure-9 gen-long-dependency-upgrade-13)
score() { python -m vkv.cli score "transcripts/long/test/$1.json" --model smollm2-135m --threads 1 "${@:2}"; }
for s in "${sessions[@]}"; do
  score "$s" --method full,none,truncate,knorm,snapkv --head-budget shared --snapkv-window 32 --ratio 3.2,8,16 \
    --json "$out/cheap-$s.json"
  score "$s" --method kvzip --ratio 3.2,8,16 --json "$out/kvzip-$s.json"
done
for s in "${sessions[@]:0:2}"; do
  score "$s" --method am --ratio 8,16 --json "$out/am-$s.json"
done
