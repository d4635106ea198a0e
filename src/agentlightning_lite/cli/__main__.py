"""``python -m agentlightning_lite.cli``: the same as ``agl-lite``."""

import sys

from . import main

sys.exit(main())
