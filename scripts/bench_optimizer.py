#!/usr/bin/env python
"""Benchmark vkv's optimiser against a straightforward loop on the test model (same as `vkv bench optimizer`).

python scripts/bench_optimizer.py                 # fp32 and 8-bit, ~300-token span, JSON to bench-optimizer.json
python scripts/bench_optimizer.py --quants fp32 --steps 20 --profile
"""

import sys

from vkv.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "optimizer", *sys.argv[1:]]))
