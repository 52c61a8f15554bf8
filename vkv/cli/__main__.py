"""`python -m vkv.cli COMMAND ...`: the same as `vkv COMMAND ...` (for launchers that take a module, e.g. torchrun -m)."""

import sys

from vkv.cli import main

sys.exit(main())
