"""The worker's C heap, faulted in ahead of use by a thread of its own.

Every page an execution's runtime touches for the first time is a page fault,
costly in a virtual machine, and a burst of parked executions adds dozens per
runtime, on the runner that reads the channel. So glibc is asked to extend the
heap ``PAD_BYTES`` at a time (``M_TOP_PAD``), and each time the heap's break
moves up, this thread faults the new stretch in with one
``madvise(MADV_POPULATE_WRITE)``: on another core when one is free, in one
system call rather than one fault per page, while the runners go on. The pages
hold nothing yet; populating them changes no content.

The cost is at most ``PAD_BYTES`` resident beyond what the heap uses, and only
in a worker whose heap has grown: glibc keeps that much at the top when it
gives memory back. Setting ``M_TOP_PAD`` also keeps glibc's mmap threshold at
128 KiB (it no longer rises as such blocks are freed), so each larger block
gets a mapping of its own: a guest making 250 arrays and strings of 0.3-0.8 MB
ran no slower (and with a quarter of the page faults). Each extension asks for
the pad too, so the worker's address-space backstop (``RLIMIT_AS``) bites up to
``PAD_BYTES`` sooner. Where glibc or the call is missing (another libc, a kernel
before 5.14), nothing is faulted in ahead and nothing else changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from typing import Final

PAD_BYTES: Final = 8 << 20
_M_TOP_PAD: Final = -2
_MADV_POPULATE_WRITE: Final = 23
_PAGE: Final = 4096


def _load_libc() -> ctypes.CDLL | None:
    """glibc's ``sbrk``, ``madvise`` and ``mallopt``, found now: a confined worker can open no file later."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sbrk.restype = ctypes.c_void_p
        libc.sbrk.argtypes = [ctypes.c_ssize_t]
        libc.madvise.restype = ctypes.c_int
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_libc: Final = _load_libc()


def populate(start: int, length: int) -> None:
    """Fault in the pages of ``[start, start + length)`` as if written, keeping their content.
    Raises OSError where the call is refused or missing (the sandbox's probe checks it is not)."""
    if _libc is None or _libc.madvise(start, length, _MADV_POPULATE_WRITE) != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")


class Prefaulter:
    """Faults in what the heap's break added since the last ``check``, on its own thread."""

    def __init__(self) -> None:
        self._libc = _libc
        self._wake = threading.Condition(threading.Lock())
        self._populated = 0  # the heap is faulted in (or was the zygote's) up to this address
        self._wanted = 0  # ... and should be up to this one
        if self._libc is None or self._libc.mallopt(_M_TOP_PAD, PAD_BYTES) != 1:
            self._libc = None
            return
        self._populated = self._wanted = self._break()
        threading.Thread(target=self._run, name="prefault", daemon=True).start()

    def _break(self) -> int:
        assert self._libc is not None
        return int(self._libc.sbrk(0) or 0)

    def check(self) -> None:
        """(A runner, as an execution starts.) Wake the thread if the heap's break moved up."""
        if self._libc is None:
            return
        top = self._break()
        if top == self._wanted:
            return
        with self._wake:
            # Trimmed: what lies above the new break is gone, and fresh again once it grows back.
            self._populated = min(self._populated, top)
            self._wanted = top
            if top > self._populated:
                self._wake.notify()

    def _run(self) -> None:
        assert self._libc is not None
        while True:
            with self._wake:
                while self._wanted <= self._populated:
                    self._wake.wait()
                start, end = self._populated & ~(_PAGE - 1), self._wanted
                self._populated = end
            # A break trimmed meanwhile makes this fail (ENOMEM) or populate what will be reused: both harmless.
            with contextlib.suppress(OSError):
                populate(start, end - start)
