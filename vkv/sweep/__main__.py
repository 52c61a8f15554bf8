"""`python -m vkv.sweep CONFIG --out DIR`: the same as `vkv sweep`."""

import sys

from vkv.sweep import main

sys.exit(main())
