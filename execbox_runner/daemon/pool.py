"""The worker processes, owned by the daemon's trio nursery, and the leases on them.

Workers are forked by the zygote (``worker/zygote.py``) ahead of demand. A
worker hosts many executions at once, each in its own QuickJS runtime: an
execution holds a ``Lease`` (a slot in one worker), not a process, so an
execution parked on a slow tool costs a runtime's memory and nothing else.
``acquire`` picks the least-loaded live worker of the execution's tenant (the
token that authenticated it: tenants never share a process unless the
operator allows it); when all are full it claims a spare (a started worker
no tenant owns yet), and the pool starts another spare in its place. The
pool keeps ``warm`` spares ready.

One relay task per worker reads its channel and routes each frame to the
lease of its slot. When a worker dies, every execution it held learns at
once (``WorkerLost``) and the pool replaces it. A lease given up before its
execution finished (timeout, cancel, host gone) is abandoned: the worker is
told to abort it; one that has not complied within ``abandon_grace`` takes no
new executions, and is killed (with whatever it still hosts) only if the
execution is still held ``STUCK_KILL_S`` later.
A worker that sends anything malformed is killed. Workers are retired after
``lifetime`` executions (1 in the hardened profile: a fresh process each).
Workers are followed through pidfds: they are the zygote's children, and a
pidfd cannot signal a recycled PID. Workers that outlive their zygote (killed,
crashed) come back to the daemon, a child subreaper, which reaps them on
SIGCHLD with the zygote itself: none is left a zombie, nor handed to PID 1
(the supervisor in a container, which would not reap them).
"""

from __future__ import annotations

import logging
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
from . import reaper

log = logging.getLogger(__name__)

READY_TIMEOUT_S: Final = 30.0
# Messages a lease may have waiting before its worker is judged to be flooding.
LEASE_BACKLOG: Final = 4096
# A tenant's worker with no execution for this long is stopped (the default tenant keeps its warm ones).
TENANT_IDLE_S: Final = 30.0
# A retired worker still holding an aborted execution this long after its grace is stuck: killed.
STUCK_KILL_S: Final = 30.0


class WorkerLost(Exception):
    """The worker's channel closed or carried something that is not a worker message."""


class Worker:
    """One worker process, its channel and the executions it hosts."""

    def __init__(self, pid: int, pidfd: int, stream: trio.SocketStream, max_frame: int) -> None:
        self.pid = pid  # for reading its memory from /proc; signals go through the pidfd
        self.pidfd = pidfd
        self.stream = stream
        self.max_frame = max_frame
        self.tenant: str | None = None  # a spare until an execution's tenant claims it
        self.leases: dict[int, Lease] = {}
        self.started = 0  # executions given to this worker over its life
        self.retiring = False  # takes no new executions; stopped once its last one ends
        self.alive = True
        self.idle_since = trio.current_time()
        self._next_slot = 0
        self._buffer = bytearray()
        self._send_lock = trio.Lock()

    def lease(self) -> Lease:
        self._next_slot += 1
        lease = self.leases[self._next_slot] = Lease(self, self._next_slot)
        self.started += 1
        return lease

    async def send(self, slot: int, message: ipc.ToWorker) -> None:
        async with self._send_lock:
            try:
                await self.stream.send_all(ipc.frame(slot, message))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                raise WorkerLost(str(exc)) from None

    async def receive(self) -> tuple[int, ipc.FromWorker]:
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


class Lease:
    """One execution's slot in a worker, and the worker's messages for it."""

    def __init__(self, worker: Worker, slot: int) -> None:
        self.worker = worker
        self.slot = slot
        self.finished = False  # the worker has sent this slot's Finished
        self.abandoned = False  # given up before it finished; the worker was told to abort
        self._inbox, self._outbox = trio.open_memory_channel[ipc.ToolCalls | ipc.Finished | WorkerLost](math.inf)

    async def send(self, message: ipc.ToWorker) -> None:
        await self.worker.send(self.slot, message)

    async def receive(self) -> ipc.ToolCalls | ipc.Finished:
        message = await self._outbox.receive()
        if isinstance(message, WorkerLost):
            raise message
        return message

    def deliver(self, message: ipc.ToolCalls | ipc.Finished) -> None:
        if self._inbox.statistics().current_buffer_used >= LEASE_BACKLOG:
            raise WorkerLost(f"worker flooded slot {self.slot}")
        self._inbox.send_nowait(message)

    def lose(self, reason: WorkerLost) -> None:
        """The worker is gone: the execution's next ``receive`` raises ``reason``."""
        self._inbox.send_nowait(reason)


class ZygoteClient:
    """The daemon's side: start the zygote, ask it for workers, reap what exits."""

    def __init__(self, worker_args: list[str]) -> None:
        self.worker_args = worker_args
        self.process: trio.Process | None = None
        self._control: trio.socket.SocketType | None = None
        self._lock = trio.Lock()

    async def start(self) -> None:
        # Orphans of the zygote (its workers, when it dies first) become our children, to reap.
        reaper.become_subreaper()
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


class WorkerPool:
    """Leases slots in workers and keeps enough workers started."""

    def __init__(
        self,
        *,
        warm: int,
        max_workers: int,
        capacity: int,
        lifetime: int,
        max_frame: int,
        worker_args: list[str],
        abandon_grace: float,
    ) -> None:
        # A worker start (fork, confinement, first runtime) costs milliseconds of CPU: under
        # a burst, starting one per waiting execution at once would starve the executions
        # of the CPU they wait for.
        self.max_starting = max(1, os.cpu_count() or 1)
        self.warm = warm
        self.max_workers = max(max_workers, warm, 1)
        self.capacity = max(capacity, 1)
        self.lifetime = lifetime or math.inf
        self.max_frame = max_frame
        self.abandon_grace = abandon_grace
        self.zygote = ZygoteClient(worker_args)
        self.workers: set[Worker] = set()
        self.starting = 0  # worker starts under way
        self.waiting = 0  # executions waiting for room
        self.exits = 0  # worker processes that exited (and were replaced)
        self._room = trio.lowlevel.ParkingLot()
        self._wake_spawner = trio.Event()
        self._nursery: trio.Nursery | None = None

    @property
    def pids(self) -> list[int]:
        """The zygote's and the live workers' PIDs."""
        zygote = self.zygote.process
        return [*([zygote.pid] if zygote is not None else []), *(worker.pid for worker in self.workers)]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the pool topped up until cancelled; reports started once ``warm`` workers are ready."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(reaper.reap_on_exits, self.zygote.owned)
            try:
                await self.zygote.start()
                self._top_up()
                while len(self._spares()) < self.warm:
                    await self._wait_change()
                    self._top_up()
                task_status.started()
                while True:
                    with trio.move_on_after(TENANT_IDLE_S):
                        await self._wait_change()
                    self._retire_idle_tenants()
                    self._top_up()
            finally:
                for worker in list(self.workers):
                    worker.kill()
                await self.zygote.aclose()

    async def _wait_change(self) -> None:
        await self._wake_spawner.wait()
        self._wake_spawner = trio.Event()

    def _usable(self, tenant: str | None) -> list[Worker]:
        return [w for w in self.workers if w.tenant == tenant and w.alive and not w.retiring]

    def _spares(self) -> list[Worker]:
        return self._usable(None)

    def _top_up(self) -> None:
        """Start workers until ``warm`` spares are ready (and one for each execution waiting for room)."""
        assert self._nursery is not None
        wanted = self.warm + (1 if self.waiting else 0)
        while (
            len(self._spares()) + self.starting < wanted
            and len(self.workers) + self.starting < self.max_workers
            and self.starting < self.max_starting
        ):
            self.starting += 1
            self._nursery.start_soon(self._spawn)

    def _retire_idle_tenants(self) -> None:
        now = trio.current_time()
        for worker in list(self.workers):
            if worker.tenant is not None and not worker.leases and now - worker.idle_since >= TENANT_IDLE_S:
                self._retire(worker)

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
        self._room.unpark_all()
        self._wake_spawner.set()
        await self._relay(worker)

    async def _fork_worker(self) -> Worker:
        pid, channel = await self.zygote.fork()
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            channel.close()
            raise WorkerLost("worker exited at once") from None
        worker = Worker(pid, pidfd, trio.SocketStream(trio.socket.from_stdlib_socket(channel)), self.max_frame)
        try:
            with trio.fail_after(READY_TIMEOUT_S):
                if not isinstance((await worker.receive())[1], ipc.Ready):
                    raise WorkerLost("worker did not start with Ready")
        except BaseException:
            worker.kill()
            os.close(pidfd)
            await worker.stream.aclose()
            raise
        return worker

    async def _relay(self, worker: Worker) -> None:
        """Route the worker's frames to their leases until its channel ends; then tell every lease left.

        The channel is read to its end even after the process exits: the last
        messages of its executions may still be buffered there.
        """
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_exit, worker)
            try:
                while True:
                    slot, message = await worker.receive()
                    lease = worker.leases.get(slot)
                    if lease is None or lease.finished or not isinstance(message, ipc.ToolCalls | ipc.Finished):
                        raise WorkerLost(f"worker sent {type(message).__name__} for slot {slot}")
                    if isinstance(message, ipc.Finished):
                        lease.finished = True
                    if lease.abandoned:
                        if lease.finished:
                            self._forget(lease)
                        continue
                    lease.deliver(message)
            except WorkerLost as exc:
                worker.kill()
                for lease in worker.leases.values():
                    if not lease.finished and not lease.abandoned:
                        lease.lose(exc)
        with trio.CancelScope(shield=True):
            await worker.stream.aclose()

    async def _watch_exit(self, worker: Worker) -> None:
        """Wait for the worker to exit, whenever that is, and forget it."""
        try:
            await worker.exited()
        finally:
            worker.alive = False
            self.exits += 1
            os.close(worker.pidfd)
            worker.pidfd = -1
            self.workers.discard(worker)
            self._wake_spawner.set()

    async def acquire(self, tenant: str = "") -> Lease:
        """A slot in the least-loaded live worker of ``tenant``, else in a spare it claims; waits
        (and asks for more) when there is neither."""
        while True:
            candidates = [w for w in self._usable(tenant) if len(w.leases) < self.capacity]
            if not candidates and self._spares():
                spare = self._spares()[0]
                spare.tenant = tenant
                candidates = [spare]
                self._wake_spawner.set()  # a spare fewer: start its replacement
            if candidates:
                worker = min(candidates, key=lambda w: len(w.leases))
                lease = worker.lease()
                if worker.started >= self.lifetime:
                    worker.retiring = True
                    self._wake_spawner.set()
                return lease
            self.waiting += 1
            self._wake_spawner.set()
            try:
                await self._room.park()
            finally:
                self.waiting -= 1

    def release(self, lease: Lease, *, misbehaved: bool = False) -> None:
        """The execution no longer needs its slot. One that has not finished is aborted and
        abandoned (see ``_abandon``). A worker that ``misbehaved`` (sent something invalid) may
        be taken over: it is killed, and the executions it hosts end with ``internal_error``."""
        if misbehaved and lease.worker.alive:
            log.warning("worker %d sent an invalid message; killing it", lease.worker.pid)
            lease.worker.kill()
        if lease.finished or not lease.worker.alive:
            self._forget(lease)
            return
        lease.abandoned = True
        assert self._nursery is not None
        self._nursery.start_soon(self._abandon, lease)

    async def _abandon(self, lease: Lease) -> None:
        worker = lease.worker
        try:
            await lease.send(ipc.Abort())
        except WorkerLost:
            return
        await trio.sleep(self.abandon_grace)
        if worker.leases.get(lease.slot) is not lease:
            return
        # Slow to let go (a starved CPU) or stuck: take no new executions, so that the
        # worker ends with its last one; kill it only if the slot is still held much later.
        log.warning("worker %d has not let go of an aborted execution; retiring it", worker.pid)
        self._retire(worker)
        await trio.sleep(STUCK_KILL_S)
        if worker.leases.get(lease.slot) is lease:
            log.warning("worker %d is stuck in an aborted execution; killing it with its others", worker.pid)
            worker.kill()

    def _forget(self, lease: Lease) -> None:
        worker = lease.worker
        worker.leases.pop(lease.slot, None)
        if not worker.leases:
            worker.idle_since = trio.current_time()
            if worker.retiring:
                worker.kill()
        self._room.unpark_all()
        self._wake_spawner.set()

    def _retire(self, worker: Worker) -> None:
        worker.retiring = True
        if not worker.leases:
            worker.kill()
        self._wake_spawner.set()
