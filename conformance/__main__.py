"""``python -m execbox_runner_conformance``: the same as the ``execbox-conformance`` command."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
