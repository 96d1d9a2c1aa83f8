"""A guest runtime's memory limit, enforced where a refusal can be counted.

``MemoryLimit`` enforces the guest's memory limit in QuickJS's allocator hooks
(``JSRuntime.mf``, which the arena allocator calls for each arena of small
blocks, ``ARENA_BYTES``, and each large block) instead of QuickJS's own check,
and counts what it refuses. A refusal is the evidence of a real out-of-memory:
QuickJS's own failure values (an error object, ``null``, or no value at all
when even that cannot be allocated) are all values guest code can make or hold.
A build of ``deploy/quickjs/build.py`` makes the same check in C
(``NATIVE_BUDGET``), where the arena allocator calls the hooks, set and read
through its binding (``Context.set_memory_budget``, ``.memory_budget``), and
then no hook is installed: each hook is a ctypes callback that takes the GIL
back while the guest runs, on every allocation of every execution.

Where the binding's private layout does not hold (``native.SUPPORTED``),
``MemoryLimit`` falls back to the budget in C where the build has it, else to
QuickJS's own limit, which counts nothing. ``trim_heap`` gives freed runtimes'
pages back to the kernel.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections.abc import Callable
from typing import Final

import quickjs

from .native import ARENA_BYTES, NATIVE_BUDGET, SUPPORTED, Allocator, allocator

# Whether its binding sets and reads that budget (deploy/quickjs/patches/0006); a build without
# them has its budgets checked in the hooks.
_BUDGET_CALLS: Final = NATIVE_BUDGET and hasattr(quickjs.Context, "memory_budget")


_MALLOC: Final = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_CALLOC: Final = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
_REALLOC: Final = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_USABLE_SIZE: Final = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p)


def _pointers(allocator: Allocator) -> tuple[int | None, ...]:
    return (allocator.calloc, allocator.malloc, allocator.realloc, allocator.usable_size)


class _Defaults:
    """QuickJS's own allocator functions (every runtime of the binding starts with them)."""

    def __init__(self, context: quickjs.Context) -> None:
        self.pointers = _pointers(allocator(context))
        calloc, malloc, realloc, usable_size = (pointer or 0 for pointer in self.pointers)
        self.calloc = _CALLOC(calloc)
        self.malloc = _MALLOC(malloc)
        self.realloc = _REALLOC(realloc)
        self.usable_size = _USABLE_SIZE(usable_size)


_defaults: Final = _Defaults(quickjs.Context()) if SUPPORTED else None


def _budget_holds() -> bool:
    """The binding's budget works: a fresh runtime has refused nothing, and one given a budget
    refuses a request past it and counts the refusal."""
    context = quickjs.Context()
    held, refusals = context.memory_budget()
    if refusals:
        return False
    context.set_memory_budget(held + (256 << 10))
    try:
        context.eval('"x".repeat(1 << 21).length')
    except quickjs.JSException:
        pass
    return bool(context.memory_budget()[1] == 1)


# The budget is checked in C where the build can, set and read through its binding.
_native_budget: Final = _BUDGET_CALLS and _budget_holds()


def budgets_memory() -> bool:
    """Whether ``MemoryLimit`` enforces limits where the arena allocator asks for memory, counting
    refusals, in C or in the allocator hooks (else QuickJS's own limit applies)."""
    return _native_budget or _defaults is not None


def budget_in_c() -> bool:
    """Whether ``MemoryLimit`` checks budgets in C (else in the allocator hooks, or QuickJS's own limit)."""
    return _native_budget


# Once an allocation was refused, QuickJS must still be able to raise its out-of-memory error:
# the error object, its message and its stack trace may need new arenas. So past a refusal,
# arena-sized requests may take the runtime this far over its limit. Without it, whether the
# guest sees that error (with its position), an error without its innermost frame, or a bare
# null depended on the free space left in the arenas in use.
_RESERVE_BYTES: Final = 64 << 10


class _Budget:
    """What a runtime's hooks need: its allocator state (None once released), its limit, its refusals."""

    __slots__ = ("allocator", "limit", "refusals")

    def __init__(self, allocator: Allocator, limit: int) -> None:
        self.allocator: Allocator | None = allocator
        self.limit = limit
        self.refusals = 0

    def refuses(self, size: int) -> bool:
        allocator = self.allocator
        if allocator is None or allocator.size + size <= self.limit:
            return False
        if self.refusals and size <= ARENA_BYTES and allocator.size + size <= self.limit + _RESERVE_BYTES:
            return False
        self.refusals += 1
        return True


class _NativeBudget:
    """A runtime whose budget is checked in C: its context (None once released), and the refusals
    counted there once released."""

    __slots__ = ("context", "refusals")

    def __init__(self, context: quickjs.Context) -> None:
        self.context: quickjs.Context | None = context
        self.refusals = 0


# Budgets of live MemoryLimits, by the key their runtime's hooks receive as opaque pointer.
_budgets: Final[dict[int, _Budget]] = {}
_keys: Final = itertools.count(1)
# Held while reading a runtime's allocator state from another thread (``MemoryLimit.used``) and
# while ``MemoryLimit.release`` lets go of it, so that nothing reads a runtime being freed.
_release_lock: Final = threading.Lock()


class MemoryLimit:
    """A runtime's memory limit, enforced where a refusal can be counted (see the module docstring).

    The check runs when QuickJS asks its backing allocator for memory: for a
    new arena of small blocks or for a large block, so the limit is exact for
    large allocations and may be passed by the free space of the arenas in use,
    and by up to 64 KiB of arenas once an allocation was refused (the room to
    raise the out-of-memory error, see ``_RESERVE_BYTES``). Without the native
    layout, QuickJS enforces the limit itself and ``refusals`` stays 0
    (``counts`` is False). ``release`` comes before the runtime is freed.
    """

    __slots__ = ("_budget", "_key", "counts")

    def __init__(self, context: quickjs.Context, limit: int) -> None:
        self._key = 0
        self._budget: _Budget | _NativeBudget | None = None
        if _native_budget:
            self.counts = True
            self._budget = _NativeBudget(context)
            context.set_memory_budget(max(limit, 1))  # in place of QuickJS's own limit; 0 would be none
            return
        state = allocator(context) if _defaults is not None else None
        self.counts = state is not None and _pointers(state) == _defaults.pointers  # type: ignore[union-attr]
        if state is None or not self.counts:
            context.set_memory_limit(limit)
            return
        self._budget = _Budget(state, limit)
        state.limit = 0  # QuickJS's own check off: the budget is checked in the hooks
        self._key = next(_keys)
        _budgets[self._key] = self._budget
        state.opaque = self._key
        state.calloc, state.malloc, state.realloc = _HOOKS

    def __del__(self) -> None:
        # Not released (a run dropped unfinished): the runtime may outlive this object, and its
        # hooks then find no budget under their key and allocate freely.
        _budgets.pop(self._key, None)

    def release(self) -> int:
        """The runtime is about to be freed: stop enforcing and reading. The bytes it held."""
        _budgets.pop(self._key, None)
        budget = self._budget
        if budget is None:
            return 0
        with _release_lock:
            if isinstance(budget, _NativeBudget):
                if budget.context is None:
                    return 0
                held, budget.refusals = budget.context.memory_budget()
                budget.context = None
                return int(held)
            allocator, budget.allocator = budget.allocator, None
            return 0 if allocator is None else int(allocator.size)

    @property
    def refusals(self) -> int:
        """Allocations refused for this runtime so far."""
        budget = self._budget
        if isinstance(budget, _NativeBudget):
            context = budget.context  # read by the thread that runs the guest, which also releases it
            return budget.refusals if context is None else context.memory_budget()[1]
        return 0 if budget is None else budget.refusals

    @property
    def used(self) -> int:
        """Bytes the runtime holds from its allocator now (0 where the hooks are not in place, or once released).

        Safe from any thread: ``release`` waits for a reading in progress."""
        budget = self._budget
        if budget is None:
            return 0
        with _release_lock:
            if isinstance(budget, _NativeBudget):
                return 0 if budget.context is None else budget.context.memory_budget()[0]
            return 0 if budget.allocator is None else int(budget.allocator.size)


def _calloc_hook(key: int | None, count: int, size: int) -> int | None:
    budget = _budgets.get(key or 0)
    if budget is not None and budget.refuses(count * size):
        return None
    assert _defaults is not None
    return _defaults.calloc(key, count, size)  # type: ignore[no-any-return]


def _malloc_hook(key: int | None, size: int) -> int | None:
    budget = _budgets.get(key or 0)
    if budget is not None and budget.refuses(size):
        return None
    assert _defaults is not None
    return _defaults.malloc(key, size)  # type: ignore[no-any-return]


def _realloc_hook(key: int | None, pointer: int | None, size: int) -> int | None:
    budget = _budgets.get(key or 0)
    assert _defaults is not None
    if budget is not None and budget.refuses(size - (_defaults.usable_size(pointer) if pointer else 0)):
        return None
    return _defaults.realloc(key, pointer, size)  # type: ignore[no-any-return]


_CALLBACKS: Final = (_CALLOC(_calloc_hook), _MALLOC(_malloc_hook), _REALLOC(_realloc_hook))
_HOOKS: Final = tuple(ctypes.cast(callback, ctypes.c_void_p).value for callback in _CALLBACKS)


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, found now: a confined worker can open no file later."""
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_size_t]
    return function


_malloc_trim: Final = _load_malloc_trim()


def trim_heap() -> bool:
    """Give the C heap's free pages back to the kernel; whether any were.

    Freed runtimes leave their pages in the heap, resident, and glibc returns
    only the top of it by itself. This walks the free memory (its time grows
    with what there is to give back) and holds the allocator's lock meanwhile:
    other threads that allocate wait.
    """
    return _malloc_trim is not None and _malloc_trim(0) == 1
