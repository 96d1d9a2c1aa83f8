"""The daemon's side of the zygote (``worker/zygote.py``): start it, ask it for workers, learn how each exited.

Workers are the zygote's children, so only the zygote learns their wait status,
and reports it here; workers that outlive their zygote come back to the daemon,
a child subreaper, whose reaper reports theirs. A dead zygote is started again
at the next fork.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import subprocess
import sys
from typing import Final

import trio

from ...protocol import ipc
from . import reaper

# How long an exited worker's wait status may take to reach the daemon before it is called unknown.
STATUS_WAIT_S: Final = 2.0


class _Exit:
    """A forked worker's wait status, once reported."""

    def __init__(self) -> None:
        self.reported = trio.Event()
        self.status: int | None = None
        self.cpu_limit = False  # killed at its CPU-time backstop


class ZygoteClient:
    """The daemon's side: start the zygote, ask it for workers, learn how each one exited."""

    def __init__(self, worker_args: list[str]) -> None:
        self.worker_args = worker_args
        self.process: trio.Process | None = None
        self._control: trio.socket.SocketType | None = None
        self._forked: trio.MemoryReceiveChannel[int] | None = None  # the zygote's answers to fork requests
        self._exits: dict[int, _Exit] = {}  # forked workers whose exit the pool has not yet learned
        self._nursery: trio.Nursery | None = None
        self._lock = trio.Lock()

    async def start(self, nursery: trio.Nursery) -> None:
        """Start the zygote; a task in ``nursery`` reads its reports (also of the zygotes that
        ``fork`` starts when one has died)."""
        self._nursery = nursery
        await self._start()

    async def _start(self) -> None:
        assert self._nursery is not None
        # Orphans of the zygote (its workers, when it dies first) become our children, to reap.
        reaper.become_subreaper()
        if self._control is not None:
            self._control.close()  # a dead zygote's
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "execbox_runner.worker.zygote", str(child.fileno()), *self.worker_args],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                # One malloc arena: fewer address-space reservations under the workers' RLIMIT_AS.
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "MALLOC_ARENA_MAX": "1"},
            )
        finally:
            child.close()
        self._control = trio.socket.from_stdlib_socket(parent)
        answers, self._forked = trio.open_memory_channel[int](math.inf)
        self._nursery.start_soon(self._read_reports, self._control, answers)

    async def _read_reports(self, control: trio.socket.SocketType, answers: trio.MemorySendChannel[int]) -> None:
        """Until this zygote's control socket ends: each new worker's PID to ``fork``, each exit
        status to ``exited``. The zygote sends a worker's FORKED before its EXITED."""
        size = ipc.ZYGOTE_REPORT.size
        buffer = b""
        with answers:
            while True:
                try:
                    chunk = await control.recv(4096)
                except (OSError, trio.ClosedResourceError):
                    return
                if not chunk:
                    return
                buffer += chunk
                while len(buffer) >= size:
                    kind, pid, status = ipc.ZYGOTE_REPORT.unpack_from(buffer)
                    buffer = buffer[size:]
                    if kind == ipc.FORKED:
                        self._exits[pid] = _Exit()
                        answers.send_nowait(pid)
                    else:
                        self.exited(pid, status, cpu_limit=kind == ipc.CPU_LIMIT)

    async def fork(self) -> tuple[int, socket.socket]:
        """A new worker: its PID and the daemon's end of its channel."""
        async with self._lock:
            if self._control is None or self.process is None or self.process.returncode is not None:
                await self._start()
            assert self._control is not None and self._forked is not None
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                await self._control.sendmsg(
                    [b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", theirs.fileno()))]
                )
                try:
                    pid = await self._forked.receive()
                except trio.EndOfChannel:
                    self._control.close()
                    self._control = None
                    raise OSError("the zygote exited") from None
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            return pid, ours

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
        with trio.move_on_after(STATUS_WAIT_S):
            await ended.reported.wait()
        del self._exits[pid]
        return ended.status, ended.cpu_limit

    def owned(self) -> list[trio.Process]:
        """The zygote, for the reaper: reaped through trio, so ``fork`` sees it is gone."""
        return [self.process] if self.process is not None else []

    async def aclose(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.process is not None:
            if self.process.returncode is None:
                self.process.kill()
            with trio.CancelScope(shield=True):
                await self.process.wait()
