"""What a daemon process says as it starts: the JavaScript engine in use, and the line on stdout
that tells a caller (and the tests) where it serves, printed by a lone daemon or a supervisor."""

from __future__ import annotations

import importlib.metadata

from ..worker import native


def engine() -> str:
    """The JavaScript engine in use, as ``info`` and the start-up lines name it: quickjs-ng's
    version (a build of ``deploy/quickjs/build.py`` carries a local label saying how it was tuned)
    and which build it is: only that build sets ``NATIVE_BUDGET``."""
    build = "tuned build of deploy/quickjs/build.py" if native.NATIVE_BUDGET else "stock wheel from PyPI"
    return f"quickjs-ng {importlib.metadata.version('quickjs-ng')} ({build})"


def listening_line(address: str) -> str:
    """The line on stdout once the daemon serves: the engine, then the URL as its last word."""
    return f"execbox-runner with {engine()} listening on {address}"
