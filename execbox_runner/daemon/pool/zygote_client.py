"""The daemon's side of the zygote (``worker/zygote.py``): start it, ask it for workers, learn how each exited.

Workers are the zygote's children, so only the zygote learns their wait status,
and reports it here; workers that outlive their zygote come back to the daemon,
a child subreaper, whose reaper reports theirs. A dead zygote is started again
at the next fork.

The zygote, and so every worker, gets only the part of the daemon's environment that starting
the interpreter needs (``worker_environment``): the daemon's may hold its tokens and other secrets,
which a worker taken over by guest code would find in its own memory.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
from collections import deque
from collections.abc import Mapping
from typing import Final

import trio

from ...protocol import ipc
from ..net.reactor import READ, Reactor
from . import reaper

# How long an exited worker's wait status may take to reach the daemon before it is called unknown.
STATUS_WAIT_S: Final = 2.0
# The variables of the daemon's environment the zygote is started with: the interpreter's (its
# paths), the loader's and the C library's (libraries, allocator), the locale and the time zone
# (guest dates use it). None of them is the daemon's setting or a secret.
WORKER_VARIABLES: Final = frozenset({"LANG", "LANGUAGE", "TZ", "GLIBC_TUNABLES"})
WORKER_VARIABLE_PREFIXES: Final = ("PYTHON", "LD_", "LC_", "MALLOC_")


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """What of ``environ`` (the daemon's) the zygote and its workers get, and their own settings."""
    kept = {
        name: value
        for name, value in environ.items()
        if name in WORKER_VARIABLES or name.startswith(WORKER_VARIABLE_PREFIXES)
    }
    # One malloc arena: fewer address-space reservations under the workers' RLIMIT_AS.
    return {**kept, "PYTHONDONTWRITEBYTECODE": "1", "MALLOC_ARENA_MAX": "1"}


class _Exit:
    """A forked worker's wait status, once reported."""

    def __init__(self) -> None:
        self.reported = trio.Event()
        self.status: int | None = None
        self.cpu_limit = False  # killed at its CPU-time backstop


class _Fork:
    """A fork request sent, awaiting the zygote's answer: the new worker's PID (None: the zygote
    exited first)."""

    def __init__(self) -> None:
        self.answered = trio.Event()
        self.pid: int | None = None


class ZygoteClient:
    """The daemon's side: start the zygote, ask it for workers, learn how each one exited.

    The reactor reads the zygote's reports as they come (no task of its own waits for them), and a
    fork request is a write, the answers coming in the order of the requests."""

    def __init__(self, worker_args: list[str], reactor: Reactor) -> None:
        self.worker_args = worker_args
        self.process: trio.Process | None = None
        self._reactor = reactor
        self._control: socket.socket | None = None
        self._reports = b""  # of a report not yet whole
        self._forks: deque[_Fork] = deque()  # requests sent, in order, awaiting their answers
        self._exits: dict[int, _Exit] = {}  # forked workers whose exit the pool has not yet learned
        self._lock = trio.Lock()  # one start at a time

    async def start(self) -> None:
        """Start the zygote (``fork`` starts it again when it has died)."""
        async with self._lock:
            await self._start()

    async def _start(self) -> None:
        # Orphans of the zygote (its workers, when it dies first) become our children, to reap.
        reaper.become_subreaper()
        self._control_ended()  # a dead zygote's
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "execbox_runner.worker.zygote", str(child.fileno()), *self.worker_args],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                env=worker_environment(os.environ),
            )
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        parent.setblocking(False)
        self._control, self._reports = parent, b""
        self._reactor.register(parent.fileno(), READ, self._readable)

    def _readable(self, _mask: int) -> None:
        """(The reactor.) Each new worker's PID to its ``fork``, each exit status to ``exited``. The
        zygote sends a worker's FORKED before its EXITED."""
        assert self._control is not None
        try:
            chunk = self._control.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._control_ended()
            return
        size = ipc.ZYGOTE_REPORT.size
        reports = self._reports + chunk
        whole = len(reports) - len(reports) % size
        for offset in range(0, whole, size):
            kind, pid, status = ipc.ZYGOTE_REPORT.unpack_from(reports, offset)
            if kind == ipc.FORKED:
                self._exits[pid] = _Exit()
                if self._forks:
                    request = self._forks.popleft()
                    request.pid = pid
                    request.answered.set()
            else:
                self.exited(pid, status, cpu_limit=kind == ipc.CPU_LIMIT)
        self._reports = reports[whole:]

    def _control_ended(self) -> None:
        """The zygote's control socket is done with (it exited, or the pool stops): the requests
        still awaiting an answer get none."""
        if self._control is not None:
            self._reactor.unregister(self._control.fileno())
            trio.lowlevel.notify_closing(self._control)  # a request waiting for room learns it
            self._control.close()
            self._control = None
        while self._forks:
            self._forks.popleft().answered.set()

    async def fork(self) -> tuple[int, socket.socket]:
        """A new worker: its PID and the daemon's end of its channel."""
        if self._gone():
            async with self._lock:  # the zygote died: start another (once, whoever asks)
                if self._gone():
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

    def _gone(self) -> bool:
        """Whether there is no zygote to ask: none started, or it exited."""
        return self._control is None or self.process is None or self.process.returncode is not None

    async def _request(self, channel: socket.socket) -> _Fork:
        """Send the zygote a fork request carrying ``channel``; its answer comes to the request
        returned. Queued as it is sent, with nothing awaited between: answers match in order."""
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", channel.fileno()))]
        while True:
            control = self._control
            if control is None:
                raise OSError("the zygote exited")
            try:
                control.sendmsg([b"F"], ancillary)
            except BlockingIOError:  # a zygote this far behind is rare: wait for room
                await trio.lowlevel.wait_writable(control)
                continue
            request = _Fork()
            self._forks.append(request)
            return request

    def exited(self, pid: int, status: int, *, cpu_limit: bool = False) -> None:
        """Worker ``pid`` ended with wait ``status`` (``cpu_limit``: at its CPU-time backstop): reported
        by its zygote, or by the reaper when it outlived its zygote."""
        ended = self._exits.get(pid)
        if ended is not None and not ended.reported.is_set():
            ended.status = status
            ended.cpu_limit = cpu_limit
            ended.reported.set()

    async def exit_status(self, pid: int) -> tuple[int | None, bool]:
        """The wait status of worker ``pid``, which has exited, and whether it was killed at its CPU-time
        backstop; None if no status is reported within ``STATUS_WAIT_S`` (say, the zygote died between
        reaping it and reporting it)."""
        ended = self._exits.get(pid)
        if ended is None:
            return None, False
        if not ended.reported.is_set():
            with trio.move_on_after(STATUS_WAIT_S):
                await ended.reported.wait()
        del self._exits[pid]
        return ended.status, ended.cpu_limit

    def owned(self) -> list[trio.Process]:
        """The zygote, for the reaper: reaped through trio, so ``fork`` sees it is gone."""
        return [self.process] if self.process is not None else []

    async def aclose(self) -> None:
        self._control_ended()
        if self.process is not None:
            if self.process.returncode is None:
                self.process.kill()
            with trio.CancelScope(shield=True):
                await self.process.wait()
