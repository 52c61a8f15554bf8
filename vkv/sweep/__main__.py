"""`python -m vkv.sweep CONFIG --out DIR`: the same as `vkv sweep`."""

import sys

from . import main

sys.exit(main())
