"""Reaping: no child of the daemon is ever left a zombie.

The daemon process (and the supervisor, with ``--processes``) is a child
subreaper: processes orphaned below it, such as workers that outlive a killed
zygote, or the zygote of a shard that died, become its children instead of
going to PID 1, which in a container may be the daemon itself or something
that never reaps. On every SIGCHLD it reaps what has exited. The processes it
started with trio are reaped through their ``trio.Process`` (``poll``), which
keeps their exit status for whoever waits on them; every other child directly,
its wait status and CPU time handed to ``on_exit`` (the pool: how an orphaned worker ended).
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable, Sequence
from typing import Final, TypeAlias

import trio

PR_SET_CHILD_SUBREAPER: Final = 36
OnExit: TypeAlias = Callable[[int, int, float], None]  # (pid, wait status, CPU seconds) of a child reaped directly


def become_subreaper() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap(owned: Sequence[trio.Process], on_exit: OnExit | None = None) -> None:
    """Reap every child that has exited, ``owned`` ones through trio; ``on_exit(pid, status, cpu_seconds)``
    for the others. Never blocks."""
    for process in owned:
        process.poll()
    pids = {process.pid for process in owned}
    while True:
        try:
            exited = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return  # no children at all
        if exited is None or exited.si_pid in pids:
            return  # none exited; or an owned one exited since its poll: its SIGCHLD is on the way
        pid, status, usage = os.wait4(exited.si_pid, os.WNOHANG)
        if on_exit is not None and pid:
            on_exit(pid, status, usage.ru_utime + usage.ru_stime)


def _after_the_receiver(signum: int, frame: object) -> None:
    """SIGCHLD once ``reap_on_exits`` has ended: nothing to do (a child that exits then is reaped
    by whoever waits on it next). It stands where the default action was because CPython reports a
    SIGCHLD that came as the receiver closed, its handler gone before it ran, as an error on stderr
    ("Signal 17 ignored due to race condition"), a traceback amid the daemon's log lines."""


async def reap_on_exits(owned: Callable[[], Sequence[trio.Process]], on_exit: OnExit | None = None) -> None:
    """Reap whenever a child exits, until cancelled."""
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL:  # what the receiver puts back as it closes
        signal.signal(signal.SIGCHLD, _after_the_receiver)
    with trio.open_signal_receiver(signal.SIGCHLD) as exits:
        reap(owned(), on_exit)
        async for _ in exits:
            reap(owned(), on_exit)
