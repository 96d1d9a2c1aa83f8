"""``python -m execbox_runner``: the same command line as ``execbox-runner``."""

import sys

from .cli import main

sys.exit(main())
