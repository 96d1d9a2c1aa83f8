"""Reaching past the quickjs binding into QuickJS itself, where the binding falls short.

The binding can neither stop nor pause a context that is running JavaScript,
nor reuse compiled code, nor say that an allocation was refused, nor share
memory with JavaScript, and all of these matter here:

* ``poke`` interrupts a running guest from another thread. The binding's
  interrupt check compares process CPU time with ``interrupt_data.start`` and
  ``.limit``, two fields of the ``Context`` object captured when an eval or job
  starts; writing them makes the next check, within microseconds, raise QuickJS's
  uncatchable interrupt, as a real time limit would. The guest's heap survives,
  so its logs can still be read.
* ``hold`` pauses a running guest from another thread (a tenant's share of the
  CPU, ``turns.py``): it swaps the runtime's interrupt handler
  (``JS_SetInterruptHandler``) for one that waits until ``let_go`` puts the
  binding's own back, then checks as it does. The binding's handler is found
  once per process, inside JSRuntime, while a guest spins (``HOLDS``).
* ``Bytecode`` compiles the bootstrap once per process and loads it into each
  fresh context (``JS_WriteObject``/``JS_ReadObject``, exported by the
  binding's library), about four times faster than compiling its source again,
  and without the source text every function would otherwise keep.
* ``allocator`` reads and writes a runtime's allocator state in place
  (``JSMallocState`` and its hooks): ``memory_limit`` enforces guests' memory
  limits through it.
* ``share`` gives a context an ArrayBuffer over memory the worker owns
  (``JS_NewArrayBuffer`` without a function to free it), where the bootstrap
  writes log lines for the worker to read while the guest runs (``logring``).

All of them depend on the binding's private ``ContextData``
layout, verified once per process: the exported ``JS_GetRuntime`` must map the
stored context pointer to the stored runtime pointer, an engine call must copy
the stored time limit into the interrupt data, and the runtime's
``JSMallocState`` must say what ``JS_ComputeMemoryUsage`` says. Where that
fails, ``SUPPORTED`` is false: ``poke`` does nothing (the daemon then kills a
worker that does not stop in time), the worker evaluates the bootstrap source
instead, and ``MemoryLimit`` falls back to the budget in C where the build has
it. ``SHARES`` also says
that an ArrayBuffer made by ``share`` reads and writes that memory; where it
does not, the bootstrap keeps log lines until the worker polls them, as a step ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import time
from collections.abc import Callable
from typing import Final

import quickjs

# Offsets in the binding's ContextData (LP64): PyObject_HEAD (16), JSRuntime
# *runtime, JSContext *context, int has_time_limit, clock_t time_limit,
# PyThreadState *thread_state, InterruptData {clock_t start, clock_t limit}.
_RUNTIME: Final = 16
_CONTEXT: Final = 24
_TIME_LIMIT: Final = 40
_START: Final = 56
_LIMIT: Final = 64
_FAR_PAST: Final = -(1 << 50)

_EXCEPTION_TAG: Final = 6
_EVAL_COMPILE_ONLY: Final = 1 << 5
# Functions, without their source text: each function of a runtime would otherwise keep its own
# copy of its text (for Function.prototype.toString), ~8.7 KiB of every runtime's heap for the
# bootstrap. Its functions then print as native ones do; positions in stack traces stay.
_WRITE_BYTECODE: Final = 1
_STRIP_SOURCE: Final = 1 << 4
_READ_BYTECODE: Final = 1


class _JSValue(ctypes.Structure):
    """QuickJS's JSValue on 64-bit builds without NaN-boxing: a union and a tag."""

    _fields_ = [("u", ctypes.c_int64), ("tag", ctypes.c_int64)]


# Whether the QuickJS build checks a runtime's memory budget itself (``MemoryLimit``).
NATIVE_BUDGET: Final[bool] = getattr(quickjs, "NATIVE_BUDGET", False)


class Allocator(ctypes.Structure):
    """The head of QuickJS's JSRuntime: JSMallocFunctions, then JSMallocState."""

    _fields_ = [
        ("calloc", ctypes.c_void_p),
        ("malloc", ctypes.c_void_p),
        ("free", ctypes.c_void_p),
        ("realloc", ctypes.c_void_p),
        ("usable_size", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("size", ctypes.c_size_t),
        ("limit", ctypes.c_size_t),
        ("opaque", ctypes.c_void_p),
    ]


def allocator(context: quickjs.Context) -> Allocator:
    """The allocator state at the head of ``context``'s runtime (read and written in place)."""
    return Allocator.from_address(_word(context, _RUNTIME).value)


def _word(context: quickjs.Context, offset: int) -> ctypes.c_long:
    return ctypes.c_long.from_address(id(context) + offset)


def _js_context(context: quickjs.Context) -> int:
    return _word(context, _CONTEXT).value


def _load_library() -> ctypes.CDLL | None:
    if sys.maxsize != 2**63 - 1:
        return None
    try:
        import _quickjs  # noqa: PLC0415 - a missing extension module means no native access, not an error

        lib = ctypes.CDLL(_quickjs.__file__)
        lib.JS_GetRuntime.restype = ctypes.c_void_p
        lib.JS_GetRuntime.argtypes = [ctypes.c_void_p]
        lib.JS_Eval.restype = _JSValue
        lib.JS_Eval.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_int]
        lib.JS_WriteObject.restype = ctypes.c_void_p
        lib.JS_WriteObject.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), _JSValue, ctypes.c_int]
        lib.JS_ReadObject.restype = _JSValue
        lib.JS_ReadObject.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
        lib.JS_EvalFunction.restype = _JSValue
        lib.JS_EvalFunction.argtypes = [ctypes.c_void_p, _JSValue]
        lib.JS_FreeValue.restype = None
        lib.JS_FreeValue.argtypes = [ctypes.c_void_p, _JSValue]
        lib.js_free.restype = None
        lib.js_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.JS_NewArrayBuffer.restype = _JSValue
        lib.JS_NewArrayBuffer.argtypes = [
            ctypes.c_void_p,  # context
            ctypes.c_void_p,  # data
            ctypes.c_size_t,  # length
            ctypes.c_size_t,  # maximum length: 0, not resizable
            ctypes.c_void_p,  # realloc function: none, the memory is not the engine's
            ctypes.c_void_p,  # its opaque
            ctypes.c_bool,  # shared
        ]
        lib.JS_GetGlobalObject.restype = _JSValue
        lib.JS_GetGlobalObject.argtypes = [ctypes.c_void_p]
        lib.JS_SetInterruptHandler.restype = None
        lib.JS_SetInterruptHandler.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.JS_SetPropertyStr.restype = ctypes.c_int
        lib.JS_SetPropertyStr.argtypes = [ctypes.c_void_p, _JSValue, ctypes.c_char_p, _JSValue]
    except (OSError, AttributeError, ImportError):
        return None
    return lib if _layout_holds(lib) else None


def _layout_holds(lib: ctypes.CDLL) -> bool:
    context = quickjs.Context()
    if lib.JS_GetRuntime(_js_context(context)) != _word(context, _RUNTIME).value:
        return False
    for seconds in (7.0, 3.0):
        context.set_time_limit(seconds)
        context.eval("0")
        stored = _word(context, _TIME_LIMIT).value
        if stored <= 0 or stored != _word(context, _LIMIT).value:
            return False
    context.set_memory_limit(123 << 20)
    usage = context.memory()
    state = allocator(context)
    return (state.count, state.size, state.limit, state.opaque) == (
        usage["malloc_count"],
        usage["malloc_size"],
        123 << 20,
        None,
    )


_lib: Final = _load_library()
SUPPORTED: Final = _lib is not None


def poke(context: quickjs.Context) -> None:
    """Make the context's running (or next checked) guest code hit its time limit now.

    Safe from any thread while the owning thread runs JavaScript: aligned word
    writes are atomic, and the next engine call re-initialises both fields.
    """
    if SUPPORTED:
        _word(context, _START).value = _FAR_PAST
        _word(context, _LIMIT).value = 0


# QuickJS's interrupt handler: (JSRuntime *, void *opaque) -> nonzero to interrupt.
_HANDLER: Final = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_gates: dict[int, threading.Event] = {}  # runtime -> what its held guest waits on (``hold``)


def _interrupt_handler() -> Callable[[int, int], int] | None:
    """The binding's own interrupt handler, and where JSRuntime keeps it: found while a guest
    spins on another thread (the binding sets the handler, with the context's interrupt data as
    its opaque, around each engine call), then confirmed by ``JS_SetInterruptHandler`` moving
    exactly those words."""
    assert _lib is not None
    context = quickjs.Context()
    context.set_time_limit(60)
    runtime = _word(context, _RUNTIME).value
    try:
        usable = ctypes.CDLL(None).malloc_usable_size
    except AttributeError:
        return None
    usable.restype, usable.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    size = usable(runtime) // 8  # JSRuntime's words, read no further
    words = (ctypes.c_uint64 * size).from_address(runtime)
    opaque = id(context) + _START
    spinning = threading.Thread(target=_spin, args=(context,))
    spinning.start()
    found: list[int] = []
    deadline = time.monotonic() + 1
    while not found and spinning.is_alive() and time.monotonic() < deadline:
        found = [i for i in range(1, size) if words[i] == opaque]
    handler = int(words[found[0] - 1]) if len(found) == 1 else 0
    while spinning.is_alive():
        poke(context)
        spinning.join(0.01)
    if not handler:
        return None
    _lib.JS_SetInterruptHandler(runtime, 0x5151, 0x7272)
    moved = (words[found[0] - 1], words[found[0]]) == (0x5151, 0x7272)
    _lib.JS_SetInterruptHandler(runtime, None, None)
    return _HANDLER(handler) if moved else None


def _spin(context: quickjs.Context) -> None:
    with contextlib.suppress(quickjs.JSException):
        context.eval("for (;;) {}")


def _held(runtime: int, opaque: int) -> int:
    """The interrupt handler of a held guest: wait to be let go, then check as the binding does."""
    gate = _gates.get(runtime)
    if gate is not None:
        gate.wait()
    assert _binding_handler is not None
    return _binding_handler(runtime, opaque)


_HELD: Final = _HANDLER(_held)


def hold(context: quickjs.Context) -> None:
    """Make the context's running guest code wait at its next interrupt check (within
    microseconds) until ``let_go``, from another thread, the GIL released meanwhile.

    Only while the context is alive, and never after its last engine call (``GuestRun`` sees
    to both). An engine call that begins meanwhile puts the binding's handler back: the hold
    ends with it, and is made again."""
    if _binding_handler is not None:
        runtime = _word(context, _RUNTIME).value
        _gates.setdefault(runtime, threading.Event())
        _lib.JS_SetInterruptHandler(runtime, _HELD, id(context) + _START)  # type: ignore[union-attr]


def let_go(context: quickjs.Context) -> None:
    """End ``hold``: the binding's handler back, then the guest woken."""
    runtime = _word(context, _RUNTIME).value
    gate = _gates.pop(runtime, None)
    if gate is not None:
        _lib.JS_SetInterruptHandler(runtime, _binding_handler, id(context) + _START)  # type: ignore[union-attr]
        gate.set()


class NativeError(Exception):
    """QuickJS refused to compile, load or run bytecode, or to make an ArrayBuffer."""


def share(context: quickjs.Context, name: str, address: int, length: int) -> None:
    """Make the global ``name`` of ``context`` an ArrayBuffer over the ``length`` bytes at ``address``:
    memory that outlives the context and that the engine never frees."""
    assert _lib is not None
    js_context = _js_context(context)
    buffer = _lib.JS_NewArrayBuffer(js_context, address, length, 0, None, None, False)
    if buffer.tag == _EXCEPTION_TAG:
        raise NativeError("no ArrayBuffer")
    global_object = _lib.JS_GetGlobalObject(js_context)
    status = _lib.JS_SetPropertyStr(js_context, global_object, name.encode(), buffer)  # takes the buffer
    _lib.JS_FreeValue(js_context, global_object)
    if status < 0:
        raise NativeError("the ArrayBuffer cannot be a global")


def _shares() -> bool:
    """An ArrayBuffer made by ``share`` is the memory it was given, both ways."""
    memory = ctypes.create_string_buffer(b"\x01\x02\x03\x04", 8)
    context = quickjs.Context()
    try:
        share(context, "shared", ctypes.addressof(memory), 8)
        seen = context.eval("const b = new Uint8Array(shared); b[7] = 9; [b.length, b[0], b[3], b[4]].join()")
    except (NativeError, quickjs.JSException):
        return False
    return bool(seen == "8,1,4,0" and memory.raw[7] == 9)


class Bytecode:
    """A script compiled once, run in any number of fresh contexts."""

    def __init__(self, source: str, filename: str) -> None:
        assert _lib is not None
        scratch = quickjs.Context()
        data = source.encode()
        function = _lib.JS_Eval(_js_context(scratch), data, len(data), filename.encode(), _EVAL_COMPILE_ONLY)
        if function.tag == _EXCEPTION_TAG:
            raise NativeError(f"{filename} does not compile")
        size = ctypes.c_size_t()
        flags = _WRITE_BYTECODE | _STRIP_SOURCE
        buffer = _lib.JS_WriteObject(_js_context(scratch), ctypes.byref(size), function, flags)
        _lib.JS_FreeValue(_js_context(scratch), function)
        if not buffer:
            raise NativeError(f"{filename} cannot be serialized")
        self.code = ctypes.string_at(buffer, size.value)
        _lib.js_free(_js_context(scratch), buffer)

    def run(self, context: quickjs.Context) -> None:
        """Run the script in ``context`` (its completion value is discarded)."""
        assert _lib is not None
        js_context = _js_context(context)
        function = _lib.JS_ReadObject(js_context, self.code, len(self.code), _READ_BYTECODE)
        if function.tag == _EXCEPTION_TAG:
            raise NativeError("bytecode does not load")
        result = _lib.JS_EvalFunction(js_context, function)  # takes ownership of function
        if result.tag == _EXCEPTION_TAG:
            raise NativeError("bytecode raised an exception")
        _lib.JS_FreeValue(js_context, result)


# Whether ``share`` works (see the module docstring).
SHARES: Final = SUPPORTED and _shares()
_binding_handler: Final = _interrupt_handler() if SUPPORTED else None
# Whether ``hold`` holds guests (else a worker's share of the CPU is not enforced).
HOLDS: Final = _binding_handler is not None


# The size of QuickJS's small-block arenas: 4 KiB in quickjs-ng's own builds; a build of
# ``deploy/quickjs/build.py`` has smaller ones and says so in the module.
ARENA_BYTES: Final[int] = getattr(quickjs, "ARENA_BYTES", 4096)
# The size of a size class's first arena: in such a build half the others (a parked runtime's
# classes mostly hold a few blocks each, and an arena's free blocks are memory it holds unused).
FIRST_ARENA_BYTES: Final[int] = getattr(quickjs, "FIRST_ARENA_BYTES", ARENA_BYTES)
# Whether freeing a runtime frees its arenas and large blocks whole instead of every object one
# by one (a build of ``deploy/quickjs/build.py``; less of a worker's CPU per execution).
DISCARDS_RUNTIMES: Final[bool] = getattr(quickjs, "DISCARDS_RUNTIMES", False)
# Whether the standard library's accessors are made on first use rather than with every runtime
# (a build of ``deploy/quickjs/build.py``; less memory and CPU per execution).
LAZY_ACCESSORS: Final[bool] = getattr(quickjs, "LAZY_ACCESSORS", False)
# Whether the time limit reads the CPU clock at the engine's first check in a call rather than as
# the call starts (a build of ``deploy/quickjs/build.py``: most calls end before a check and read
# no clock, a system call; ``poke`` works either way).
LAZY_CLOCK: Final[bool] = getattr(quickjs, "LAZY_CLOCK", False)
# Whether the engine was compiled for the runner's own path: instrumented, trained on its
# workload and rebuilt by the counts (a build of ``deploy/quickjs/build.py``; ~20% less per runtime).
PROFILE_GUIDED: Final[bool] = getattr(quickjs, "PROFILE_GUIDED", False)
