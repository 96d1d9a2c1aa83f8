"""A fresh QuickJS runtime with the bootstrap installed, ready for one execution.

Every execution gets a runtime of its own (``fresh_runtime``), made from the bootstrap compiled
once per process, and the stack bounds its guest runs under.
"""

from __future__ import annotations

import json
import os
import pkgutil
from typing import Final

import quickjs

from . import native
from .logring import CAPACITY, HEADER_BYTES, LogRing

# pkgutil and os.urandom rather than importlib.resources and secrets: those import tempfile,
# random, hashlib and OpenSSL (~0.6 MiB of heap in the zygote and in every worker forked from
# it, and ~3 MiB of the zygote's mapped libraries).
BOOTSTRAP: Final = (pkgutil.get_data(__package__, "bootstrap.js") or b"").decode()
# Where compiled bootstrap code leaves its dispatcher for ``fresh_runtime`` to
# collect; random per process. The dispatcher deletes it as it starts the guest.
BOOTSTRAP_KEY: Final = "__execbox_bootstrap_" + os.urandom(8).hex()
# Guest code runs on threads with this much real stack (the worker's runner threads):
# recursion as deep as Node's (~10,000 frames of a small function) fits in it.
STACK_BYTES: Final = 32 << 20
# QuickJS's own limit stays below the real stack, with room for the Python and C
# frames beneath: a larger limit than the real stack would crash the process.
MAX_STACK_BYTES: Final = STACK_BYTES - (4 << 20)
# The engine's limit while it compiles the guest's code: about 1,400 levels of the deepest-stacked
# nesting (brackets, parentheses, templates), more of the others. QuickJS's parser takes time
# growing with the square of the depth of nested blocks and is not interruptible, so deeper code
# fails at once (``guest.TOO_DEEP_MESSAGE``) instead of running into its timeout, or past it.
PARSE_STACK_BYTES: Final = 1 << 20


class Runtime:
    """A fresh QuickJS context with the bootstrap installed, ready for one execution, and the ring its
    log lines will go through (None where ``native.SHARES`` is false)."""

    def __init__(self, context: quickjs.Context, api: quickjs.Object, ring: LogRing | None) -> None:
        self.context = context
        self.api = api
        self.ring = ring


_bytecode: native.Bytecode | None = None


def fresh_runtime() -> Runtime:
    """A new runtime; from the bootstrap compiled once per process where QuickJS allows.

    That is where the native layout holds (``native.SUPPORTED``, memory budgets included):
    without it every fallback applies together (see ``native``), the bootstrap's source
    among them.
    """
    global _bytecode
    context = quickjs.Context()
    context.set_max_stack_size(PARSE_STACK_BYTES)  # the guest's own, once its code is compiled
    if not native.SUPPORTED:
        return Runtime(context, context.eval(BOOTSTRAP), None)
    if _bytecode is None:
        _bytecode = native.Bytecode(f"globalThis[{json.dumps(BOOTSTRAP_KEY)}] =\n{BOOTSTRAP}", "bootstrap.js")
    _bytecode.run(context)
    api = context.get(BOOTSTRAP_KEY)
    ring = None
    if native.SHARES:  # the ring in the dispatcher's place: no other global, no other name
        ring = LogRing()
        native.share(context, BOOTSTRAP_KEY, ring.address, HEADER_BYTES + 2 * CAPACITY)
    return Runtime(context, api, ring)  # the global goes as the guest starts
