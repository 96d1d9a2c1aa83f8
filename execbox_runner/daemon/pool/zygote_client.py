"""The daemon's side of the zygote (``worker/zygote.py``): start it, ask it for workers, learn how each exited.

Workers are the zygote's children, so only the zygote learns their wait status,
and reports it here; workers that outlive their zygote come back to the daemon,
a child subreaper, whose reaper reports theirs. A dead zygote is started again
at the next fork.

Every worker is a copy of its zygote, with its address-space layout: where ASLR put the
interpreter, QuickJS, the C library, the heap. So the zygote is renewed (a new interpreter, a new
layout) before the next fork once one of its workers died of a fault signal (a crash, perhaps an
exploit probing the layout), or once it has forked ``renew_after_forks`` workers. A replaced
zygote is retired, not killed: the write side of its control socket is shut, so it answers the
fork requests it was sent, reads the end and exits; its reports are read to their end, its
workers still alive come back to the daemon as orphans, and it is reaped. No fork request and no
exit status is lost.

The zygote, and so every worker, gets only the part of the daemon's environment that starting
the interpreter needs (``worker_environment``): the daemon's may hold its tokens and other secrets,
which a worker taken over by guest code would find in its own memory.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping
from typing import Final

import trio

from ...protocol import ipc
from ..net.reactor import READ, Reactor
from . import reaper

log = logging.getLogger(__name__)

# How long an exited worker's wait status may take to reach the daemon before it is called unknown.
STATUS_WAIT_S: Final = 2.0
# The variables of the daemon's environment the zygote is started with: the interpreter's (its
# paths), the loader's and the C library's (libraries, allocator), the locale and the time zone
# (guest dates use it). None of them is the daemon's setting or a secret.
WORKER_VARIABLES: Final = frozenset({"LANG", "LANGUAGE", "TZ", "GLIBC_TUNABLES"})
WORKER_VARIABLE_PREFIXES: Final = ("PYTHON", "LD_", "LC_", "MALLOC_")
# Forks after which a zygote is renewed. Starting one costs about 95 ms of CPU (measured: the
# interpreter, the imports, the compiled bootstrap, the first runtime), and a hardened execution's
# worker about 5 ms: renewing every 1000 forks adds about 0.1 ms, 2 %, to each.
RENEW_AFTER_FORKS: Final = 1000
# What a worker dies of when it crashes, or an exploit in it goes wrong. Not SIGKILL: the daemon's
# own kill, the OOM killer's, or the CPU-time backstop's.
FAULT_SIGNALS: Final = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGSYS, signal.SIGABRT, signal.SIGTRAP}
)


def crashed(status: int | None) -> bool:
    """Whether wait ``status`` is a death by a fault signal (``FAULT_SIGNALS``)."""
    return status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) in FAULT_SIGNALS


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What of ``environ`` (the daemon's) the zygote and its workers get, and their own settings."""
    kept = {
        name: value
        for name, value in environ.items()
        if name in WORKER_VARIABLES or name.startswith(WORKER_VARIABLE_PREFIXES)
    }
    # One malloc arena: fewer address-space reservations under the workers' RLIMIT_AS.
    return {**kept, "PYTHONDONTWRITEBYTECODE": "1", "MALLOC_ARENA_MAX": "1"}


class _Fork:
    """A fork request sent, awaiting the zygote's answer: the new worker's PID (None: the zygote
    exited first)."""

    def __init__(self) -> None:
        self.answered = trio.Event()
        self.pid: int | None = None


class _Zygote:
    """One zygote process and its control socket, which the reactor reads until its end."""

    def __init__(self, process: trio.Process, control: socket.socket) -> None:
        self.process = process
        self.control: socket.socket | None = control  # None once its reports have ended
        self.reports = b""  # of a report not yet whole
        self.forks: deque[_Fork] = deque()  # requests sent, in order, awaiting their answers
        self.forked = 0  # requests sent
        self.crashed: str | None = None  # which of its workers died of which fault signal, if one did

    def running(self) -> bool:
        return self.control is not None and self.process.returncode is None


class _Exit:
    """A forked worker's wait status, once reported, and the zygote that forked it."""

    def __init__(self, zygote: _Zygote) -> None:
        self.zygote = zygote
        self.reported = trio.Event()
        self.status: int | None = None
        self.cpu_limit = False  # killed at its CPU-time backstop
        self.cpu_seconds = 0.0  # what it spent over its life


class ZygoteClient:
    """The daemon's side: start the zygote, ask it for workers, learn how each one exited, renew it.

    The reactor reads the zygotes' reports as they come (no task of its own waits for them), and a
    fork request is a write, the answers coming in the order of the requests. ``on_crash`` is
    called when a worker has died of a fault signal: the other workers of its zygote share the
    layout the crash may have shown (``exposed``)."""

    def __init__(
        self,
        worker_args: list[str],
        reactor: Reactor,
        renew_after_forks: int = RENEW_AFTER_FORKS,
        on_crash: Callable[[], None] | None = None,
    ) -> None:
        self.worker_args = worker_args
        self.renew_after_forks = renew_after_forks
        # Zygotes renewed, by why; each reason from zero, so that the first crash shows as an increase.
        self.renewals = {"worker_crash": 0, "fork_count": 0}
        self._on_crash = on_crash
        self._reactor = reactor
        self._zygote: _Zygote | None = None  # the one that forks
        self._retired: set[_Zygote] = set()  # replaced, until their reports have ended and they are reaped
        self._exits: dict[int, _Exit] = {}  # forked workers whose exit the pool has not yet learned
        self._lock = trio.Lock()  # one start at a time

    @property
    def process(self) -> trio.Process | None:
        """The current zygote's process."""
        return None if self._zygote is None else self._zygote.process

    @property
    def pids(self) -> list[int]:
        """The PIDs of the zygotes not yet reaped: the current one and those retired."""
        return [process.pid for process in self.owned()]

    async def start(self) -> None:
        """Start the zygote (``fork`` starts it again when it has died, or renews it)."""
        async with self._lock:
            await self._start()

    async def _start(self) -> None:
        """Start a zygote in place of the current one, which is retired."""
        # Orphans of a zygote (its workers, when it exits first) become our children, to reap.
        reaper.become_subreaper()
        if self._zygote is not None:
            self._retire(self._zygote)
            self._zygote = None
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # A session of its own, as the supervisor's shards: a signal to the daemon's process group
            # (`timeout`, an init or process manager that signals groups) reaches the daemon, which
            # drains, and not the workers, whose running executions it would end.
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "execbox_runner.worker.zygote", str(child.fileno()), *self.worker_args],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                env=worker_environment(os.environ),
                start_new_session=True,
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        parent.setblocking(False)
        zygote = self._zygote = _Zygote(process, parent)
        self._reactor.register(parent.fileno(), READ, functools.partial(self._readable, zygote))

    def _retire(self, zygote: _Zygote) -> None:
        """Stop ``zygote`` forking: it answers the requests it was sent, then reads their end and
        exits. Its reports are still read, to their end (``_ended``); it is reaped as it exits."""
        if zygote.control is not None:
            with contextlib.suppress(OSError):  # it has exited already
                zygote.control.shutdown(socket.SHUT_WR)
        self._retired.add(zygote)

    def _readable(self, zygote: _Zygote, _mask: int) -> None:
        """(The reactor.) Each new worker's PID to its ``fork``, each exit status to ``exited``. The
        zygote sends a worker's FORKED before its EXITED."""
        assert zygote.control is not None
        try:
            chunk = zygote.control.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._ended(zygote)
            return
        size = ipc.ZYGOTE_REPORT.size
        reports = zygote.reports + chunk
        whole = len(reports) - len(reports) % size
        for offset in range(0, whole, size):
            kind, pid, status, cpu_us = ipc.ZYGOTE_REPORT.unpack_from(reports, offset)
            if kind == ipc.FORKED:
                self._exits[pid] = _Exit(zygote)
                if zygote.forks:
                    request = zygote.forks.popleft()
                    request.pid = pid
                    request.answered.set()
            else:
                self.exited(pid, status, cpu_us / 1e6, cpu_limit=kind == ipc.CPU_LIMIT)
        zygote.reports = reports[whole:]

    def _ended(self, zygote: _Zygote) -> None:
        """``zygote``'s control socket is done with (it exited, or the pool stops): the requests
        still awaiting its answer get none."""
        if zygote.control is not None:
            self._reactor.unregister(zygote.control.fileno())
            trio.lowlevel.notify_closing(zygote.control)  # a request waiting for room learns it
            zygote.control.close()
            zygote.control = None
        while zygote.forks:
            zygote.forks.popleft().answered.set()

    def _renewal(self) -> str | None:
        """Why the current zygote may not fork: ``gone`` (none started, or it exited), or why it is to
        be renewed, ``worker_crash`` or ``fork_count``; None if it may."""
        zygote = self._zygote
        if zygote is None or not zygote.running():
            return "gone"
        if zygote.crashed is not None:
            return "worker_crash"
        if zygote.forked >= self.renew_after_forks:
            return "fork_count"
        return None

    async def fork(self) -> tuple[int, socket.socket]:
        """A new worker: its PID and the daemon's end of its channel."""
        if self._renewal() is not None:
            async with self._lock:  # start another zygote (once, whoever asks)
                renewal = self._renewal()
                if renewal is not None:
                    if renewal != "gone":
                        self._renewed(renewal)
                    await self._start()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            request = await self._request(theirs)
            await request.answered.wait()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        if request.pid is None:
            ours.close()
            raise OSError("the zygote exited")
        return request.pid, ours

    def _renewed(self, renewal: str) -> None:
        """Log and count that the current zygote is replaced, and why."""
        zygote = self._zygote
        assert zygote is not None
        self.renewals[renewal] += 1
        log.info(
            "zygote %d renewed (%s): the next workers are forked from a new zygote, with a new address-space layout",
            zygote.process.pid,
            zygote.crashed if renewal == "worker_crash" else f"it forked {zygote.forked} workers",
            extra={"zygote_pid": zygote.process.pid, "renewal_reason": renewal},
        )

    async def _request(self, channel: socket.socket) -> _Fork:
        """Send the current zygote a fork request carrying ``channel``; its answer comes to the
        request returned. Queued as it is sent, with nothing awaited between: answers match in order."""
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", channel.fileno()))]
        while True:
            zygote = self._zygote
            if zygote is None or zygote.control is None:
                raise OSError("the zygote exited")
            try:
                zygote.control.sendmsg([b"F"], ancillary)
            except BlockingIOError:  # a zygote this far behind is rare: wait for room
                with contextlib.suppress(trio.ClosedResourceError):  # it ended meanwhile: see above
                    await trio.lowlevel.wait_writable(zygote.control)
                continue
            zygote.forked += 1
            request = _Fork()
            zygote.forks.append(request)
            return request

    def exited(self, pid: int, status: int, cpu_seconds: float, *, cpu_limit: bool = False) -> None:
        """Worker ``pid`` ended with wait ``status``, having spent ``cpu_seconds`` (``cpu_limit``: at
        its CPU-time backstop): reported by its zygote, or by the reaper when it outlived its zygote.
        A crash marks its zygote to be renewed, and its other workers ``exposed``."""
        ended = self._exits.get(pid)
        if ended is None or ended.reported.is_set():
            return
        ended.status = status
        ended.cpu_limit = cpu_limit
        ended.cpu_seconds = cpu_seconds
        ended.reported.set()
        if crashed(status) and ended.zygote.crashed is None:
            ended.zygote.crashed = f"worker {pid} died of {signal.Signals(os.WTERMSIG(status)).name}"
            if self._on_crash is not None:
                self._on_crash()

    def exposed(self, pid: int) -> bool:
        """Whether live worker ``pid`` was forked by a zygote another worker of which crashed: it has
        the layout the crash may have shown."""
        forked = self._exits.get(pid)
        return forked is not None and forked.zygote.crashed is not None

    async def exit_status(self, pid: int) -> tuple[int | None, bool, float | None]:
        """The wait status of worker ``pid``, which has exited, whether it was killed at its CPU-time
        backstop, and the CPU seconds it spent; None and None if no status is reported within
        ``STATUS_WAIT_S`` (say, the zygote died between reaping it and reporting it)."""
        ended = self._exits.get(pid)
        if ended is None:
            return None, False, None
        if not ended.reported.is_set():
            with trio.move_on_after(STATUS_WAIT_S):
                await ended.reported.wait()
        del self._exits[pid]
        return ended.status, ended.cpu_limit, ended.cpu_seconds if ended.reported.is_set() else None

    def owned(self) -> list[trio.Process]:
        """The zygotes not yet reaped, for the reaper: reaped through trio, so ``fork`` sees the
        current one is gone. A retired zygote is forgotten once reaped and its reports have ended."""
        self._retired = {z for z in self._retired if z.control is not None or z.process.returncode is None}
        zygotes = [*self._retired, *([self._zygote] if self._zygote is not None else [])]
        return [zygote.process for zygote in zygotes if zygote.process.returncode is None]

    async def aclose(self) -> None:
        """End every zygote, the current one and those retired, and reap them."""
        zygotes = [*self._retired, *([self._zygote] if self._zygote is not None else [])]
        for zygote in zygotes:
            self._ended(zygote)
            if zygote.process.returncode is None:
                zygote.process.kill()
        with trio.CancelScope(shield=True):
            for zygote in zygotes:
                await zygote.process.wait()
