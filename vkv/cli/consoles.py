"""The command line's two consoles: `console` (stdout) for results, `errors` (stderr) for errors and progress, so a
redirected stdout holds results only."""

from __future__ import annotations

import sys

from rich.console import Console

# Piped output (logs, CI) gets wide tables instead of rich's 80-column default.
console = Console() if sys.stdout.isatty() else Console(width=160)
errors = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=160)  # keeps stdout parseable
