"""Interrupt a running QuickJS guest from another thread.

The quickjs binding offers no way to stop a context that is running JavaScript
(the GIL is released, but its interrupt check only compares process CPU time
with the limit captured when the eval or job started). That check reads two
fields of the ``Context`` object, ``interrupt_data.start`` and ``.limit``;
writing them makes the very next check, within microseconds, raise QuickJS's
uncatchable interrupt, exactly as a real time limit would. The guest's heap
survives, so its logs can still be read afterwards.

The field offsets are the binding's private layout, so they are verified once
per process (pointer cross-check through the exported ``JS_GetRuntime``, the
stored time limit copied into the interrupt data). Where the check fails, ``SUPPORTED`` is false and ``poke`` does nothing: the daemon then
falls back to killing a worker that does not stop in time.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Final

import quickjs

# Offsets in the binding's ContextData (x86-64 / aarch64 LP64 layout):
# PyObject_HEAD (16), JSRuntime *runtime, JSContext *context, int has_time_limit,
# clock_t time_limit, PyThreadState *thread_state, InterruptData {start, limit}.
_RUNTIME: Final = 16
_CONTEXT: Final = 24
_TIME_LIMIT: Final = 40
_START: Final = 56
_LIMIT: Final = 64
_FAR_PAST: Final = -(1 << 50)


def _word(context: quickjs.Context, offset: int) -> ctypes.c_long:
    return ctypes.c_long.from_address(id(context) + offset)


def poke(context: quickjs.Context) -> None:
    """Make the context's running (or next checked) guest code hit its time limit now.

    Safe to call from any thread while the owning thread runs JavaScript; aligned
    word writes are atomic, and the next engine call re-initialises both fields.
    """
    if SUPPORTED:
        _poke_unchecked(context)


def _self_test() -> bool:
    """Cheap checks that the layout is the one described above (no guest code runs).

    The binding's ``JS_GetRuntime`` must map the stored context pointer to the
    stored runtime pointer, and an engine call must copy the stored time limit
    into ``interrupt_data.limit``. tests/test_guest.py also interrupts a spinning
    guest for real.
    """
    if sys.maxsize != 2**63 - 1:
        return False
    try:
        import _quickjs

        lib = ctypes.CDLL(_quickjs.__file__)
        lib.JS_GetRuntime.restype = ctypes.c_void_p
        lib.JS_GetRuntime.argtypes = [ctypes.c_void_p]
        context = quickjs.Context()
        if lib.JS_GetRuntime(_word(context, _CONTEXT).value) != _word(context, _RUNTIME).value:
            return False
        for seconds in (7.0, 3.0):
            context.set_time_limit(seconds)
            context.eval("0")
            stored = _word(context, _TIME_LIMIT).value
            if stored <= 0 or stored != _word(context, _LIMIT).value:
                return False
        return True
    except (OSError, AttributeError, ValueError, ImportError):
        return False


def _poke_unchecked(context: quickjs.Context) -> None:
    _word(context, _START).value = _FAR_PAST
    _word(context, _LIMIT).value = 0


SUPPORTED: Final = _self_test()
