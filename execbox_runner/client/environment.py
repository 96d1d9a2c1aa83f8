"""The environment variables of the client commands: where a runner is and its bearer token.

Every command that talks to a runner (``exec``, ``mcp``, ``replay``) reads
``EXECBOX_RUNNER_URL`` and ``EXECBOX_RUNNER_TOKEN`` when its ``--url`` or
``--token`` is not given, the same ``EXECBOX_RUNNER_`` prefix as the daemon's
own settings. Earlier names are still read when the new one is unset, with a
one-line warning on stderr naming the new one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Final, TextIO

URL_ENV: Final = "EXECBOX_RUNNER_URL"
TOKEN_ENV: Final = "EXECBOX_RUNNER_TOKEN"  # noqa: S105 -- the name of the variable, not a token
DEPRECATED: Final = {URL_ENV: ("EXECBOX_URL",), TOKEN_ENV: ("EXECBOX_TOKEN",)}


def from_environment(
    name: str, prog: str, environ: Mapping[str, str] | None = None, warnings: TextIO | None = None
) -> str | None:
    """The value of the variable ``name``, else of the first of its deprecated names that is set
    (with a warning from ``prog`` on ``warnings``, stderr by default); ``None`` when none is set."""
    environ = os.environ if environ is None else environ
    if environ.get(name):
        return environ[name]
    for old in DEPRECATED.get(name, ()):
        if environ.get(old):
            print(f"{prog}: warning: {old} is deprecated; set {name} instead", file=warnings or sys.stderr)
            return environ[old]
    return None
