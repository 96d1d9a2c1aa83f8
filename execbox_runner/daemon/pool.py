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

One relay task per worker reads its channel and hands each frame to the
receiver of its slot's lease (the session's connection), at once. Frames to a
worker are offered to its channel at once too; what the channel does not take
is written in order by the worker's writer task. When a worker dies, every
execution it held learns at once (``WorkerLost``) and the pool replaces it. A lease given up before its
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

Every worker exit is one log line saying why, and is counted by reason in
``exit_reasons``: stopped by the daemon (a label of ``STOPPED``), or died on
its own (``signal_SIGSEGV``; ``signal_SIGKILL``: not the daemon's, so perhaps
the OOM killer; ``cpu_limit``: its RLIMIT_CPU backstop; ``exit_N``), or
``unknown``. Only a worker's parent learns its wait status: the zygote reports
it for the workers it reaps, the daemon's reaper for orphans.
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import socket
import struct
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from typing import Final, Literal, NamedTuple, Protocol, TypeAlias

import trio

from ..protocol import ipc
from . import reaper
from .machine import usable_cores

log = logging.getLogger(__name__)

READY_TIMEOUT_S: Final = 30.0
# What a slot's host may have left unread of what its worker sent before the worker is judged to be
# flooding it: a guest's tool calls and logs each fit a message, and a host reads them as they come.
LEASE_BACKLOG_BYTES: Final = 64 << 20
# A tenant's worker with no execution for this long is stopped (the default tenant keeps its warm ones).
TENANT_IDLE_S: Final = 30.0
# A retired worker still holding an aborted execution this long after its grace is stuck: killed.
STUCK_KILL_S: Final = 30.0
# A worker that does not take a frame for this long has stopped reading its channel.
SEND_TIMEOUT_S: Final = 10.0
# How long a worker has to report its heaps when the memory budget is spent.
MEASURE_TIMEOUT_S: Final = 1.0
# A worker whose channel closed this long ago and that has not exited is killed.
CLOSED_EXIT_S: Final = 1.0
# How long an exited worker's wait status may take to reach the daemon before it is called unknown.
STATUS_WAIT_S: Final = 2.0


class ExitCause(NamedTuple):
    """How a worker ended: the label counted in ``WorkerPool.exit_reasons``, a log level, words."""

    reason: str
    level: int
    text: str


StopReason: TypeAlias = Literal["retired", "idle", "slow_abort", "stuck", "misbehaved", "start_timeout", "shutdown"]
# Why the daemon stops a worker (``Worker.kill``): each reason's log level and words.
STOPPED: Final[dict[StopReason, tuple[int, str]]] = {
    "retired": (logging.INFO, "stopped by the daemon: retired after its lifetime of executions"),
    "idle": (logging.INFO, f"stopped by the daemon: idle in its tenant's service for {TENANT_IDLE_S:g} s"),
    "slow_abort": (logging.WARNING, "stopped by the daemon: retired for being slow to let go of an aborted execution"),
    "stuck": (logging.WARNING, f"killed by the daemon: still stuck in an aborted execution {STUCK_KILL_S:g} s later"),
    "misbehaved": (logging.WARNING, "killed by the daemon: it sent something invalid or closed its channel"),
    "start_timeout": (logging.WARNING, f"killed by the daemon: not ready {READY_TIMEOUT_S:g} s after its start"),
    "shutdown": (logging.INFO, "stopped by the daemon: shutting down"),
}


def exit_cause(status: int | None, killed: StopReason | None, cpu_limit: bool = False) -> ExitCause:
    """How a worker with wait ``status`` (None: never reported) ended; ``killed`` is why the daemon
    sent it SIGKILL, if it did; ``cpu_limit``: the kernel's SIGKILL at its RLIMIT_CPU, as its zygote
    saw. A SIGKILL the daemon did not send, or any other end, is the worker's own."""
    if cpu_limit:
        return ExitCause("cpu_limit", logging.WARNING, "killed by the kernel at its CPU-time backstop (RLIMIT_CPU)")
    if status is None:
        return ExitCause("unknown", logging.WARNING, "exited; how is unknown (no exit status reached the daemon)")
    if os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        return ExitCause(f"exit_{code}", logging.WARNING, f"exited on its own with status {code}")
    number = os.WTERMSIG(status)
    if number == signal.SIGKILL and killed is not None:
        return ExitCause(killed, *STOPPED[killed])
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"SIG{number}"
    text = f"died of {name} ({signal.strsignal(number)})"
    if number == signal.SIGKILL:
        text += ", not sent by the daemon: the kernel's OOM killer, or someone else"
    elif number == signal.SIGXCPU:
        text += ", from its CPU-time backstop (RLIMIT_CPU)"
    return ExitCause(f"signal_{name}", logging.WARNING, text)


class WorkerLost(Exception):
    """The worker's channel closed or carried something that is not a worker message."""


class ChannelClosed(WorkerLost):
    """The worker's channel closed: usually because the worker is exiting."""


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
        self.retiring: StopReason | None = None  # why it takes no new executions; stopped once its last one ends
        self.ready = False  # said Ready: it takes executions
        self.alive = True
        self.kill_reason: StopReason | None = None  # why the daemon sent it SIGKILL
        self.gone = trio.Event()  # the process has exited
        self.cause: ExitCause | None = None  # how it ended, once known (None: the pool stopped first)
        self.idle_since = trio.current_time()
        self._next_slot = 0
        self._frames = ipc.Unframer(max_frame)
        self._backlog: list[bytes] = []  # frames the channel has not taken yet, for the writer task
        self._writing = False  # the writer task holds frames it is writing
        self._wake_writer = trio.Event()
        self._heaps: ipc.Heaps | None = None  # its answer to the last Measure
        self._measured = trio.Event()

    def lease(self) -> Lease:
        self._next_slot += 1
        lease = self.leases[self._next_slot] = Lease(self, self._next_slot)
        self.started += 1
        return lease

    async def heaps(self) -> list[tuple[Lease, int]]:
        """Each running execution's lease and the bytes its heap holds, as the worker reports them;
        nothing if it does not answer within ``MEASURE_TIMEOUT_S``. A worker could lie here: what
        bounds it regardless is its address-space limit (see ``server.worker_heap_bytes``)."""
        self._heaps, self._measured = None, trio.Event()
        try:
            self.send(0, ipc.Measure())
        except WorkerLost:
            return []
        with trio.move_on_after(MEASURE_TIMEOUT_S):
            await self._measured.wait()
        sizes: list[tuple[int, int]] = self._heaps.sizes if self._heaps is not None else []
        leases = ((self.leases.get(slot), size) for slot, size in sizes)
        return [
            (lease, size) for lease, size in leases if lease is not None and not (lease.finished or lease.abandoned)
        ]

    def measured(self, heaps: ipc.Heaps) -> None:
        self._heaps = heaps
        self._measured.set()

    def send(self, slot: int, message: ipc.ToWorker) -> None:
        """Send one frame after those sent before it: offered to the channel at once, which takes it
        whole unless the worker has stopped reading; the rest goes through the writer task (a frame is
        never cut short: half of one would garble the channel for every execution on it). A worker
        that has not taken it within ``SEND_TIMEOUT_S`` is killed. WorkerLost if the channel is broken."""
        data = ipc.frame(slot, message)
        if self._backlog or self._writing:
            self._backlog.append(data)
            return
        try:
            sent = os.write(self.stream.socket.fileno(), data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise WorkerLost(str(exc)) from None
        if sent < len(data):
            self._backlog.append(data[sent:])
            self._wake_writer.set()

    async def write_backlog(self) -> None:
        """The writer task: write what the channel did not take at once, in order, until cancelled."""
        while True:
            await self._wake_writer.wait()
            self._wake_writer = trio.Event()
            while self._backlog:
                data, self._backlog, self._writing = b"".join(self._backlog), [], True
                with trio.move_on_after(SEND_TIMEOUT_S) as scope:
                    try:
                        await self.stream.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        self._backlog = []  # its relay sees the channel end and reports the loss
                self._writing = False
                if scope.cancelled_caught:
                    log.warning("worker %d did not read its channel for %g s; killing it", self.pid, SEND_TIMEOUT_S)
                    self.kill("stuck")
                    return

    async def receive(self) -> tuple[int, ipc.FromWorker]:
        try:
            while (body := self._frames.next()) is None:
                try:
                    chunk = await self.stream.receive_some(max(65536, self._frames.missing()))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    raise ChannelClosed(str(exc)) from None
                if not chunk:
                    raise ChannelClosed("worker channel closed")
                self._frames.feed(chunk)
        except ipc.FrameTooLarge as exc:
            raise WorkerLost(f"worker frame of {exc.length} bytes exceeds {self.max_frame}") from None
        try:
            return ipc.from_worker_decoder.decode(body)
        except Exception as exc:
            raise WorkerLost(f"undecodable worker message: {exc}") from None

    def kill(self, reason: StopReason) -> None:
        """SIGKILL it, for ``reason``, unless it has exited already (then how it ended is its own)."""
        self.alive = False
        if self.pidfd < 0 or _readable(self.pidfd):
            return
        self.kill_reason = self.kill_reason or reason
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone

    async def exited(self) -> None:
        """Return once the process has exited (it need not be our child)."""
        if self.pidfd >= 0:
            await trio.lowlevel.wait_readable(self.pidfd)


def _readable(fd: int) -> bool:
    """Whether ``fd`` is readable now (a pidfd: its process has exited). poll, not select: any fd number."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class LeaseReceiver(Protocol):
    """Who takes a lease's messages from its worker: the execution's connection."""

    @property
    def backlog(self) -> int:
        """Bytes it has sent its host that the host has not taken yet."""

    def worker_message(self, lease: Lease, message: ipc.ToolCalls | ipc.Finished) -> None: ...

    def worker_lost(self, lease: Lease, reason: WorkerLost) -> None: ...


class Lease:
    """One execution's slot in a worker; the worker's messages for it go to its ``receiver`` at once.

    A message arrives while its receiver's host may still be reading the last ones: a worker whose
    messages pile up unread there (``LEASE_BACKLOG_BYTES``) is judged to be flooding the slot.
    """

    __slots__ = ("abandoned", "finished", "receiver", "run_sent", "slot", "worker")

    def __init__(self, worker: Worker, slot: int) -> None:
        self.worker = worker
        self.slot = slot
        self.finished = False  # the worker has sent this slot's Finished
        self.abandoned = False  # given up before it finished; the worker was told to abort
        self.run_sent = False  # the Run was sent: the worker knows this slot
        self.receiver: LeaseReceiver | None = None

    def send(self, message: ipc.ToWorker) -> None:
        """Send ``message`` for this slot (see ``Worker.send``)."""
        if isinstance(message, ipc.Run):
            self.run_sent = True
        self.worker.send(self.slot, message)

    def deliver(self, message: ipc.ToolCalls | ipc.Finished) -> None:
        receiver = self.receiver
        if receiver is None:
            return
        if receiver.backlog > LEASE_BACKLOG_BYTES:
            raise WorkerLost(f"worker flooded slot {self.slot}")
        receiver.worker_message(self, message)

    def lose(self, reason: WorkerLost) -> None:
        """The worker is gone: the receiver learns it."""
        if self.receiver is not None:
            self.receiver.worker_lost(self, reason)


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
        self.max_starting = usable_cores()
        self.warm = warm
        self.max_workers = max(max_workers, warm, 1)
        self.capacity = max(capacity, 1)
        self.lifetime = lifetime or math.inf
        self.max_frame = max_frame
        self.abandon_grace = abandon_grace
        self.zygote = ZygoteClient(worker_args)
        self.workers: set[Worker] = set()
        self.starting = 0  # worker starts under way
        self._waiting: deque[tuple[str, Callable[[Lease], None]]] = deque()  # tenant, and whom to give a slot
        self._serving = False  # _serve_waiting is under way
        self.exits = 0  # worker processes that exited (and were replaced)
        self.exit_reasons: dict[str, int] = {}  # the same by ExitCause.reason (a bounded set)
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
            nursery.start_soon(reaper.reap_on_exits, self.zygote.owned, self.zygote.exited)
            try:
                await self.zygote.start(nursery)
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
                self._nursery = None  # stopping: an execution let go now has nothing to abort
                for worker in list(self.workers):
                    worker.kill("shutdown")
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
                self._retire(worker, "idle")

    async def _spawn(self) -> None:
        """Start a worker and relay its frames until it exits; after a failed start, pause before the
        next one (do not spin when workers cannot be started)."""
        try:
            worker = await self._fork_worker()
        except OSError:
            worker = None
        if worker is not None:
            await self._relay(worker)
        if worker is None or not worker.ready:
            await trio.sleep(0.5)
            self.starting -= 1
            self._wake_spawner.set()

    async def _fork_worker(self) -> Worker:
        """A worker just forked: ``_relay`` waits for its Ready."""
        pid, channel = await self.zygote.fork()
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            pidfd = -1  # exited at once: its channel reads as closed, its status comes from the zygote
        return Worker(pid, pidfd, trio.SocketStream(trio.socket.from_stdlib_socket(channel)), self.max_frame)

    async def _relay(self, worker: Worker) -> None:
        """Once the worker is ready, route its frames to their leases until its channel ends; then
        tell every lease left. Once it has exited too, count and log how it ended.

        The channel is read to its end even after the process exits: the last
        messages of its executions may still be buffered there.
        """
        held = 0  # executions it hosted when its channel ended
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_exit, worker)
                async with trio.open_nursery() as channel:
                    channel.start_soon(worker.write_backlog)
                    try:
                        await self._ready(worker)
                        while True:
                            self._route(worker, *await worker.receive())
                    except WorkerLost as exc:
                        held = sum(not lease.finished for lease in worker.leases.values())
                        await self._lost(worker, exc)
                    finally:
                        channel.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await worker.stream.aclose()
            self._count_exit(worker, held)

    def _route(self, worker: Worker, slot: int, message: ipc.FromWorker) -> None:
        """Hand a worker's frame to whom it concerns; WorkerLost if it concerns nobody it may."""
        if slot == 0 and isinstance(message, ipc.Heaps):
            worker.measured(message)
            return
        lease = worker.leases.get(slot)
        if lease is None or lease.finished or not isinstance(message, ipc.ToolCalls | ipc.Finished):
            raise WorkerLost(f"worker sent {type(message).__name__} for slot {slot}")
        if isinstance(message, ipc.Finished):
            lease.finished = True
        if lease.abandoned:
            if lease.finished:
                self._forget(lease)
            return
        lease.deliver(message)

    async def evict_largest(self) -> tuple[Lease, int] | None:
        """End the execution with the largest heap of all workers with ``memory_limit`` (the
        daemon's memory budget is spent); which one, and its bytes, or None if none holds any."""
        measured: list[tuple[Lease, int]] = []

        async def measure(worker: Worker) -> None:
            measured.extend(await worker.heaps())

        async with trio.open_nursery() as nursery:
            for worker in list(self.workers):
                if worker.alive:
                    nursery.start_soon(measure, worker)
        if not measured:
            return None
        lease, size = max(measured, key=lambda pair: pair[1])
        if size <= 0:
            return None
        try:
            lease.send(ipc.Evict())
        except WorkerLost:
            return None  # its relay sees the loss and ends its executions
        return lease, size

    async def _ready(self, worker: Worker) -> None:
        """Wait for the worker's Ready; then it takes executions."""
        with trio.move_on_after(READY_TIMEOUT_S) as scope:
            _, message = await worker.receive()
        if scope.cancelled_caught:
            worker.kill("start_timeout")
            raise WorkerLost(f"worker not ready within {READY_TIMEOUT_S:g} s")
        if not isinstance(message, ipc.Ready):
            raise WorkerLost("worker did not start with Ready")
        worker.ready = True
        self.starting -= 1
        self.workers.add(worker)
        self._serve_waiting()
        self._wake_spawner.set()

    async def _lost(self, worker: Worker, exc: WorkerLost) -> None:
        """Every execution the worker still hosts learns it is lost, and the worker is killed, unless
        its channel closed because it is exiting on its own: then its exit status says why."""
        worker.alive = False
        for lease in list(worker.leases.values()):  # each receiver lets its lease go as it learns
            if not lease.finished and not lease.abandoned:
                lease.lose(exc)
        if isinstance(exc, ChannelClosed):
            with trio.move_on_after(CLOSED_EXIT_S):
                await worker.gone.wait()
        worker.kill("misbehaved")

    async def _watch_exit(self, worker: Worker) -> None:
        """Wait for the worker to exit, whenever that is; forget it; learn how it ended."""
        try:
            await worker.exited()
        finally:  # also when the pool stops: the worker is stopped with it
            worker.alive = False
            if worker.pidfd >= 0:
                os.close(worker.pidfd)
                worker.pidfd = -1
            worker.gone.set()
            self.workers.discard(worker)
            self._wake_spawner.set()
        with trio.CancelScope(shield=True):  # bounded: a pool that stops meanwhile still learns it
            status, cpu_limit = await self.zygote.exit_status(worker.pid)
        worker.cause = exit_cause(status, worker.kill_reason, cpu_limit)

    def _count_exit(self, worker: Worker, held: int) -> None:
        """Count the worker's exit by reason and say, in one line, how it ended."""
        cause = worker.cause or ExitCause("shutdown", *STOPPED["shutdown"])
        self.exits += 1
        self.exit_reasons[cause.reason] = self.exit_reasons.get(cause.reason, 0) + 1
        log.log(
            cause.level,
            "worker %d %s%s; executions held: %d%s",
            worker.pid,
            "" if worker.ready else "failed to start: ",
            cause.text,
            held,
            "" if cause.reason in {"idle", "shutdown"} else "; replaced",
            extra={
                "worker_pid": worker.pid,
                "exit_reason": cause.reason,
                "executions_held": held,
                "executions_served": worker.started,
            },
        )

    def acquire(self, tenant: str, leased: Callable[[Lease], None]) -> None:
        """Call ``leased`` with a slot in the least-loaded live worker of ``tenant``, else in a spare
        it claims: now if there is room, else (asking for more workers) once there is, in the order
        executions asked; ``withdraw(leased)`` stops waiting."""
        lease = self._lease(tenant)
        if lease is not None:
            leased(lease)
            return
        self._waiting.append((tenant, leased))
        self._wake_spawner.set()

    def withdraw(self, leased: Callable[[Lease], None]) -> None:
        """An execution waiting for room no longer needs it."""
        for entry in self._waiting:
            if entry[1] == leased:
                self._waiting.remove(entry)
                return

    @property
    def waiting(self) -> int:
        """Executions waiting for room."""
        return len(self._waiting)

    def _lease(self, tenant: str) -> Lease | None:
        candidates = [w for w in self._usable(tenant) if len(w.leases) < self.capacity]
        if not candidates and self._spares():
            spare = self._spares()[0]
            spare.tenant = tenant
            candidates = [spare]
            self._wake_spawner.set()  # a spare fewer: start its replacement
        if not candidates:
            return None
        worker = min(candidates, key=lambda w: len(w.leases))
        lease = worker.lease()
        if worker.started >= self.lifetime:
            worker.retiring = "retired"
            self._wake_spawner.set()
        return lease

    def _serve_waiting(self) -> None:
        """There may be room: lease it to the executions waiting, oldest first, while there is.
        (A ``leased`` callback may free a slot again, and so come back here: the outer call serves on.)"""
        if self._serving:
            return
        self._serving = True
        try:
            index = 0
            while index < len(self._waiting):
                tenant, leased = self._waiting[index]
                lease = self._lease(tenant)
                if lease is None:
                    index += 1
                    continue
                del self._waiting[index]
                leased(lease)
                index = 0
        finally:
            self._serving = False

    def release(self, lease: Lease, *, misbehaved: bool = False) -> None:
        """The execution no longer needs its slot. One that has not finished is aborted and
        abandoned (see ``_abandon``). A worker that ``misbehaved`` (sent something invalid) may
        be taken over: it is killed, and the executions it hosts end with ``internal_error``."""
        lease.receiver = None
        if misbehaved and lease.worker.alive:
            lease.worker.kill("misbehaved")
        if lease.finished or not lease.worker.alive or not lease.run_sent or self._nursery is None:
            self._forget(lease)  # nothing runs there, it never started, or the pool has stopped
            return
        lease.abandoned = True
        self._nursery.start_soon(self._abandon, lease)

    async def _abandon(self, lease: Lease) -> None:
        worker = lease.worker
        try:
            lease.send(ipc.Abort())
        except WorkerLost:
            return
        await trio.sleep(self.abandon_grace)
        if worker.leases.get(lease.slot) is not lease:
            return
        # Slow to let go (a starved CPU) or stuck: take no new executions, so that the
        # worker ends with its last one; kill it only if the slot is still held much later.
        log.warning("worker %d has not let go of an aborted execution; retiring it", worker.pid)
        self._retire(worker, "slow_abort")
        await trio.sleep(STUCK_KILL_S)
        if worker.leases.get(lease.slot) is lease:
            worker.kill("stuck")

    def _forget(self, lease: Lease) -> None:
        worker = lease.worker
        worker.leases.pop(lease.slot, None)
        if not worker.leases:
            worker.idle_since = trio.current_time()
            if worker.retiring:
                worker.kill(worker.retiring)
            self._wake_spawner.set()  # an idle tenant's worker is retired in time
        self._serve_waiting()

    def _retire(self, worker: Worker, reason: StopReason) -> None:
        worker.retiring = worker.retiring or reason
        if not worker.leases:
            worker.kill(worker.retiring)
        self._wake_spawner.set()
