"""The standby's alarm: a timer the leader sets as it begins stepping, which wakes the standby
only if the leader is still stepping when it rings.

The standby watches the leader's steps for a long one (see ``Worker._stand_by``). Woken at
once as each step began, it cost a thread switch and a hand-over of the GIL in the middle of
the leader's step, for nothing in nearly every step: few run long. A ``timerfd`` rings after
the delay unless the leader, going idle, disarms it first; the standby sleeps in ``read`` on
it. Setting and disarming it are a system call each, made without releasing the GIL (a
thread waiting for it would take it), and the one a confined worker needs is allowed
(``seccomp.ALLOWED_SYSCALLS``); the timer is made before confinement. The C functions are
looked up as this module is imported, in the zygote: a worker forked from it makes only its
timer (looking them up was a noticeable part of each new worker's start).
"""

from __future__ import annotations

import ctypes
import os
from typing import Final

_CLOCK_MONOTONIC: Final = 1


class _Timespec(ctypes.Structure):
    _fields_ = (("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long))


class _Itimerspec(ctypes.Structure):
    _fields_ = (("it_interval", _Timespec), ("it_value", _Timespec))


_LIBC: Final = ctypes.PyDLL(None, use_errno=True)  # PyDLL: the GIL is kept across the calls
_CREATE: Final = _LIBC.timerfd_create
_CREATE.argtypes = (ctypes.c_int, ctypes.c_int)
_SETTIME: Final = _LIBC.timerfd_settime
_SETTIME.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class Alarm:
    """A one-shot timer of ``delay_s``: ``set`` it, ``disarm`` it, or ``wait`` until it rings."""

    def __init__(self, delay_s: float) -> None:
        self.fd = _CREATE(_CLOCK_MONOTONIC, os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create")
        seconds, fraction = divmod(delay_s, 1.0)
        ringing = _Itimerspec(it_value=_Timespec(int(seconds), round(fraction * 1e9)))
        self._specs = (ringing, _Itimerspec())  # kept: the calls point into them
        self._ring, self._silence = (ctypes.addressof(spec) for spec in self._specs)

    def set(self) -> None:
        """Ring once, the delay from now (unless disarmed first)."""
        self._call(self._ring)

    def disarm(self) -> None:
        """Not ring; a ring not yet read is taken back as well."""
        self._call(self._silence)

    def wait(self) -> None:
        """Sleep until the alarm rings (the GIL released meanwhile)."""
        os.read(self.fd, 8)

    def _call(self, spec: int) -> None:
        if _SETTIME(self.fd, 0, spec, None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime")
