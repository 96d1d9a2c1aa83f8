"""A warm pool of worker processes, owned by the daemon's trio nursery.

Workers are forked by the zygote (``zygote.py``) ahead of demand: the pool
keeps ``warm`` idle workers ready, confined and with a runtime prepared, and
grows on demand up to ``max_workers``. An execution holds its worker until it
ends; a worker that crashed, was killed, timed out, ran out of memory or
reached ``max_executions`` (1 in the hardened profile) is discarded and
replaced, never handed out again. Workers are followed through pidfds: they
are the zygote's children, and a pidfd cannot signal a recycled ipc.FORKED.
"""

from __future__ import annotations

import collections
import math
import os
import signal
import socket
import struct
import subprocess
import sys
from typing import Final

import trio

from ..protocol import ipc

READY_TIMEOUT_S: Final = 30.0


class WorkerLost(Exception):
    """The worker's channel closed or carried something that is not a worker message."""


class Worker:
    """One worker process and its channel."""

    def __init__(self, pidfd: int, stream: trio.SocketStream, max_frame: int) -> None:
        self.pidfd = pidfd
        self.stream = stream
        self.max_frame = max_frame
        self.executions = 0
        self.alive = True
        self._buffer = bytearray()
        self._send_lock = trio.Lock()

    async def send(self, message: ipc.ToWorker) -> None:
        async with self._send_lock:
            try:
                await self.stream.send_all(ipc.frame(message))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise WorkerLost(str(exc)) from None

    async def receive(self) -> ipc.FromWorker:
        header = await self._read(ipc.HEADER.size)
        (length,) = ipc.HEADER.unpack(header)
        if length > self.max_frame:
            raise WorkerLost(f"worker frame of {length} bytes exceeds {self.max_frame}")
        body = await self._read(length)
        try:
            return ipc.from_worker_decoder.decode(body)
        except Exception as exc:
            raise WorkerLost(f"undecodable worker message: {exc}") from None

    async def _read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            try:
                chunk = await self.stream.receive_some(max(65536, n - len(self._buffer)))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise WorkerLost(str(exc)) from None
            if not chunk:
                raise WorkerLost("worker channel closed")
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def kill(self) -> None:
        self.alive = False
        if self.pidfd >= 0:
            try:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # already gone

    async def exited(self) -> None:
        """Return once the process has exited (it need not be our child)."""
        await trio.lowlevel.wait_readable(self.pidfd)


class ZygoteClient:
    """The daemon's side: start the zygote, ask it for workers."""

    def __init__(self, worker_args: list[str]) -> None:
        self.worker_args = worker_args
        self.process: trio.Process | None = None
        self._control: trio.socket.SocketType | None = None
        self._lock = trio.Lock()

    async def start(self) -> None:
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

    async def fork(self) -> tuple[int, socket.socket]:
        """A new worker: its PID and the daemon's end of its channel."""
        async with self._lock:
            if self._control is None or self.process is None or self.process.returncode is not None:
                await self.start()
            assert self._control is not None
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                await self._control.sendmsg(
                    [b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", theirs.fileno()))]
                )
                answer = b""
                while len(answer) < ipc.FORKED.size:
                    chunk = await self._control.recv(ipc.FORKED.size - len(answer))
                    if not chunk:
                        self._control = None
                        raise OSError("the zygote exited")
                    answer += chunk
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            return ipc.FORKED.unpack(answer)[0], ours

    async def aclose(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.process is not None:
            if self.process.returncode is None:
                self.process.kill()
            with trio.CancelScope(shield=True):
                await self.process.wait()


class WorkerPool:
    """Hands out idle workers and keeps enough of them warm."""

    def __init__(
        self, *, warm: int, max_workers: int, max_executions: int, max_frame: int, worker_args: list[str]
    ) -> None:
        # A worker start (fork, confinement, first runtime) costs milliseconds of CPU: under
        # a burst, starting one per waiting execution at once would starve the executions
        # of the CPU they wait for.
        self.max_starting = max(1, os.cpu_count() or 1)
        self.warm = warm
        self.max_workers = max(max_workers, warm, 1)
        self.max_executions = max_executions or math.inf
        self.max_frame = max_frame
        self.zygote = ZygoteClient(worker_args)
        self.idle: collections.deque[Worker] = collections.deque()
        self.workers: set[Worker] = set()
        self.starting = 0
        self.exits = 0  # worker processes that exited (and were replaced)
        self._waiters = trio.lowlevel.ParkingLot()
        self._wake_spawner = trio.Event()
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the pool topped up until cancelled; reports started once ``warm`` workers are ready."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await self.zygote.start()
                self._top_up()
                while len(self.idle) < self.warm:
                    await self._wait_change()
                    self._top_up()
                task_status.started()
                while True:
                    await self._wait_change()
                    self._top_up()
            finally:
                for worker in list(self.workers):
                    worker.kill()
                await self.zygote.aclose()

    async def _wait_change(self) -> None:
        await self._wake_spawner.wait()
        self._wake_spawner = trio.Event()

    def _top_up(self) -> None:
        assert self._nursery is not None
        demand = self.warm + len(self._waiters)
        while (
            len(self.idle) + self.starting < demand
            and len(self.workers) + self.starting < self.max_workers
            and self.starting < self.max_starting
        ):
            self.starting += 1
            self._nursery.start_soon(self._spawn)

    async def _spawn(self) -> None:
        try:
            worker = await self._fork_worker()
        except (OSError, WorkerLost, trio.TooSlowError):
            worker = None
        finally:
            self.starting -= 1
        if worker is None:
            await trio.sleep(0.5)  # do not spin when processes cannot be started
            self._wake_spawner.set()
            return
        self.workers.add(worker)
        self.idle.append(worker)
        self._waiters.unpark()
        self._wake_spawner.set()
        await self._reap(worker)

    async def _fork_worker(self) -> Worker:
        pid, channel = await self.zygote.fork()
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            channel.close()
            raise WorkerLost("worker exited at once") from None
        worker = Worker(pidfd, trio.SocketStream(trio.socket.from_stdlib_socket(channel)), self.max_frame)
        try:
            with trio.fail_after(READY_TIMEOUT_S):
                if not isinstance(await worker.receive(), ipc.Ready):
                    raise WorkerLost("worker did not start with Ready")
        except BaseException:
            worker.kill()
            os.close(pidfd)
            await worker.stream.aclose()
            raise
        return worker

    async def _reap(self, worker: Worker) -> None:
        """Wait for the worker to exit, whenever that is, and forget it.

        The channel of a worker an execution still holds stays open: its last
        messages may still be buffered there, and ``release`` closes it.
        """
        try:
            await worker.exited()
        finally:
            worker.alive = False
            self.exits += 1
            os.close(worker.pidfd)
            worker.pidfd = -1
            self.workers.discard(worker)
            if worker in self.idle:
                self.idle.remove(worker)
                with trio.CancelScope(shield=True):
                    await worker.stream.aclose()
            self._wake_spawner.set()

    async def acquire(self) -> Worker:
        """An idle live worker; waits (and asks for more) when none is idle."""
        while True:
            while self.idle:
                worker = self.idle.popleft()
                if worker.alive:
                    self._wake_spawner.set()
                    return worker
            self._wake_spawner.set()
            await self._waiters.park()

    def release(self, worker: Worker, reusable: bool) -> None:
        """Return a worker after an execution; anything doubtful is killed instead."""
        worker.executions += 1
        if reusable and worker.alive and worker.executions < self.max_executions:
            self.idle.append(worker)
            self._waiters.unpark()
        else:
            worker.kill()
            assert self._nursery is not None
            self._nursery.start_soon(worker.stream.aclose)
        self._wake_spawner.set()
