#!/usr/bin/env python
"""Benchmark vkv's optimiser against a straightforward loop on the test model (same as `vkv bench optimizer`).

python scripts/bench_optimizer.py                 # fp32 and 8-bit, ~300-token span, JSON to bench-optimizer.json
python scripts/bench_optimizer.py --quants fp32 --steps 20 --profile
"""

import argparse
import sys

from vkv.errors import VkvError
from vkv.tools.bench import add_bench_args, run_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_args(parser)
    try:
        return run_bench(parser.parse_args(argv))
    except VkvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
