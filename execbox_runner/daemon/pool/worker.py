"""The worker processes as the daemon sees them: each one's channel, the leases on it, how it ended.

A worker hosts many executions at once, each in its own QuickJS runtime: an
execution holds a ``Lease`` (a slot in one worker), not a process, so an
execution parked on a slow tool costs a runtime's memory and nothing else.

A worker's channel is read by the reactor: each frame goes, at once, to the
pool's router and from there to the receiver of its slot's lease (the
session's connection). Frames to a worker are queued as the reactor's pass
produces them and written together at its end; what the channel does not take
is written in order by a writer task started for it, and a worker that has not
taken it within ``SEND_TIMEOUT_S`` is killed. A worker is untrusted: whatever
it sends is bounded (``max_frame``) and checked, and a worker that floods a
slot's host is lost (``lease_backlog``). So is one that sends file
descriptors (``SCM_RIGHTS``), which no worker does: the daemon asks for none,
so the kernel closes every one it was sent, and the worker is killed.

Every worker exit is one log line saying why, and is counted by reason: stopped
by the daemon (a label of ``STOPPED``), or died on its own (``signal_SIGSEGV``;
``signal_SIGKILL``: not the daemon's, so perhaps the OOM killer; ``cpu_limit``:
its RLIMIT_CPU backstop; ``exit_N``), or ``unknown`` (``exit_cause``).
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
from collections.abc import Awaitable, Callable
from typing import Final, Literal, NamedTuple, Protocol, TypeAlias

import trio

from ...protocol import ipc
from ..net.reactor import READ, Reactor

log = logging.getLogger(__name__)

READY_TIMEOUT_S: Final = 30.0
# A tenant's worker with no execution for this long is stopped (the default tenant keeps its warm ones).
TENANT_IDLE_S: Final = 30.0
# A retired worker still holding an aborted execution this long after its grace is stuck: killed once
# it hosts no other execution.
STUCK_KILL_S: Final = 30.0
# What a slot's host may have left unread of what its worker sent before the worker is judged to be
# flooding it, at least (``lease_backlog``): a host reads a guest's tool calls and logs as they come.
LEASE_BACKLOG_BYTES: Final = 64 << 20
# A worker that does not take a frame for this long has stopped reading its channel.
SEND_TIMEOUT_S: Final = 10.0
# How long a worker has to report its heaps when the memory budget is spent.
MEASURE_TIMEOUT_S: Final = 1.0
_MSG_CTRUNC: Final = int(socket.MSG_CTRUNC)  # a plain int: the enum's ``&`` is Python code, run per read


def lease_backlog(max_output_bytes: int) -> int:
    """What a slot's host may have left unread before its worker is judged to be flooding it, given
    ``--max-output-bytes``: a host that reads slowly has a report's tool inputs and the lines logged
    live (each up to ``max_output_bytes`` in JSON) waiting when the worker's next message comes, as
    the timeout's does; the daemon reads nothing more of that host until they are taken."""
    return max(LEASE_BACKLOG_BYTES, 4 * max_output_bytes)


class ExitCause(NamedTuple):
    """How a worker ended: the label counted in ``WorkerPool.exit_reasons``, a log level, words."""

    reason: str
    level: int
    text: str


StopReason: TypeAlias = Literal[
    "retired", "idle", "zygote_renewed", "slow_abort", "stuck", "misbehaved", "start_timeout", "shutdown"
]
# Why the daemon stops a worker (``Worker.kill``): each reason's log level and words.
STOPPED: Final[dict[StopReason, tuple[int, str]]] = {
    "retired": (logging.INFO, "stopped by the daemon: retired after its lifetime of executions"),
    "idle": (logging.INFO, f"stopped by the daemon: idle in its tenant's service for {TENANT_IDLE_S:g} s"),
    "zygote_renewed": (
        logging.INFO,
        "stopped by the daemon: its zygote forked a worker that crashed, whose address-space layout it shares",
    ),
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


Router: TypeAlias = Callable[["Worker", int, ipc.FromWorker], None]
# Starts an async function as a task (the pool's nursery's ``start_soon``).
TaskStarter: TypeAlias = Callable[[Callable[[], Awaitable[None]]], None]


class Worker:
    """One worker process, its channel and the executions it hosts."""

    def __init__(
        self,
        pid: int,
        pidfd: int,
        channel: socket.socket,
        max_output_bytes: int,
        reactor: Reactor,
        start_task: TaskStarter,
    ) -> None:
        self.pid = pid  # for reading its memory from /proc; signals go through the pidfd
        self.pidfd = pidfd
        channel.setblocking(False)
        self.channel = channel
        self.max_frame = ipc.max_frame(max_output_bytes)
        self.max_backlog = lease_backlog(max_output_bytes)
        self.tenant: str | None = None  # a spare until an execution's tenant claims it
        self.cpu_counted = 0.0  # the CPU seconds of its life already counted to its tenant (``Pool.count_cpu``)
        self.share = 0  # the guests it may run at once, as last sent (0: as many as it has threads)
        self.leases: dict[int, Lease] = {}
        self.started = 0  # executions given to this worker over its life
        self.retiring: StopReason | None = None  # why it takes no new executions; stopped once its last one ends
        self.stuck = False  # still held an aborted execution STUCK_KILL_S after retiring: killed once it hosts no other
        self.ready = False  # said Ready: it takes executions
        self.start_failure = ""  # why it could not start, as it said instead of Ready
        self.alive = True
        self.kill_reason: StopReason | None = None  # why the daemon sent it SIGKILL
        self.gone = trio.Event()  # the process has exited
        self.cause: ExitCause | None = None  # how it ended, once known (None: the pool stopped first)
        self.idle_since = trio.current_time()
        self.settled = trio.Event()  # it said Ready, or its channel ended first
        self.ended = trio.Event()  # its channel ended: ``end`` says how
        self.end: WorkerLost | None = None
        self._reactor = reactor
        self._route: Router | None = None
        self._next_slot = 0
        self._frames = ipc.Unframer(self.max_frame)
        self._queued: list[bytes] = []  # frames of the reactor's current pass, written at its end
        self._backlog: list[bytes] = []  # frames the channel has not taken yet, for the writer task
        self._writing = False  # a writer task is under way (see ``_write_backlog``)
        self._start_task = start_task
        self._writer: trio.CancelScope | None = None  # the writer task's, cancelled as the channel closes
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
        bounds it regardless is its address-space limit (see ``report.worker_heap_bytes``)."""
        self._heaps, self._measured = None, trio.Event()
        self.send(0, ipc.Measure())
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

    # ------------------------------------------------------------------ reading

    def attach(self, route: Router) -> None:
        """From now on the reactor reads the channel, and each frame goes to ``route`` (which raises
        WorkerLost for a frame that concerns nobody it may) until the channel ends."""
        self._route = route
        self._reactor.register(self.channel.fileno(), READ, self._readable)

    def _readable(self, _mask: int) -> None:
        try:
            chunk, _, flags, _ = self.channel.recvmsg(max(65536, self._frames.missing()))
        except BlockingIOError:
            return
        except OSError as exc:
            self.lose(ChannelClosed(str(exc)))
            return
        if flags & _MSG_CTRUNC:  # ancillary data, descriptors: closed by the kernel, unread
            self.lose(WorkerLost("worker sent file descriptors"))
            return
        if not chunk:
            self.lose(ChannelClosed("worker channel closed"))
            return
        self._frames.feed(chunk)
        assert self._route is not None
        try:
            while self.end is None and (body := self._frames.next()) is not None:
                try:
                    slot, message = ipc.from_worker_decoder.decode(body)
                except Exception as exc:
                    raise WorkerLost(f"undecodable worker message: {exc}") from None
                self._route(self, slot, message)
        except ipc.FrameTooLarge as exc:
            self.lose(WorkerLost(f"worker frame of {exc.length} bytes exceeds {self.max_frame}"))
        except WorkerLost as exc:
            self.lose(exc)

    def lose(self, reason: WorkerLost) -> None:
        """Its channel ended (or carried what it may not): nothing more is read from it."""
        if self.end is None:
            self.end = reason
            self._reactor.unregister(self.channel.fileno())
            self.settled.set()
            self.ended.set()

    def close(self) -> None:
        self.lose(ChannelClosed("closed by the daemon"))
        if self._writer is not None:
            self._writer.cancel()  # at once: a writer waiting for the channel no longer watches it
        self.channel.close()

    # ------------------------------------------------------------------ writing

    def send(self, slot: int, message: ipc.ToWorker) -> None:
        """Send one frame after those sent before it: written with the others of the reactor's pass
        at its end, in one system call (at once outside a pass). The channel takes them whole unless
        the worker has stopped reading; the rest goes through a writer task, started for it (a frame
        is never cut short: half of one would garble the channel for every execution on it). A
        broken channel is not the sender's to report: its reading ends, and every lease learns."""
        self._queued.append(ipc.frame(slot, message))
        if len(self._queued) == 1:
            self._reactor.later(self._flush)

    def _flush(self) -> None:
        data = self._queued[0] if len(self._queued) == 1 else b"".join(self._queued)
        self._queued = []
        if self._backlog or self._writing:
            self._backlog.append(data)
            return
        try:
            sent = os.write(self.channel.fileno(), data)
        except BlockingIOError:
            sent = 0
        except OSError:
            return  # broken or closed: its reading ends, and every lease learns
        if sent < len(data):
            self._backlog.append(data[sent:])
            self._writing = True
            self._start_task(self._write_backlog)

    async def _write_backlog(self) -> None:
        """A writer task: write what the channel did not take at once, in order, until none is left,
        unless the channel closes first; a worker that has not taken it within ``SEND_TIMEOUT_S``
        is killed. Started only when the channel is full, which a worker reading it rarely lets
        happen: a task per worker, for its whole life, cost every worker's start and end."""
        if self.end is not None:  # the channel ended before this task began
            self._writing = False
            return
        fd = self.channel.fileno()
        try:
            with trio.CancelScope() as self._writer, trio.move_on_after(SEND_TIMEOUT_S) as scope:
                while self._backlog:
                    data = memoryview(b"".join(self._backlog))
                    self._backlog = []
                    while data:
                        await trio.lowlevel.wait_writable(fd)
                        try:
                            data = data[os.write(fd, data) :]
                        except BlockingIOError:
                            continue
                        except OSError:
                            return  # broken: its reading ends, and every lease learns
        finally:
            self._writing = False
        if scope.cancelled_caught:
            log.warning("worker %d did not read its channel for %g s; killing it", self.pid, SEND_TIMEOUT_S)
            self.kill("stuck")

    # ------------------------------------------------------------------ the process

    def exited(self) -> bool:
        """Whether its process has exited (or is followed no more: its pidfd closed)."""
        return self.pidfd < 0 or _readable(self.pidfd)

    def kill(self, reason: StopReason) -> None:
        """SIGKILL it, for ``reason``, unless it has exited already (then how it ended is its own)."""
        self.alive = False
        if self.exited():
            return
        self.kill_reason = self.kill_reason or reason
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone


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
    messages pile up unread there (``lease_backlog``) is judged to be flooding the slot.
    """

    __slots__ = ("abandoned", "answered", "finished", "receiver", "run_sent", "slot", "worker")

    def __init__(self, worker: Worker, slot: int) -> None:
        self.worker = worker
        self.slot = slot
        self.answered = False  # the worker has sent something for this slot: it took the run
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
        if receiver.backlog > self.worker.max_backlog:
            raise WorkerLost(f"worker flooded slot {self.slot}")
        receiver.worker_message(self, message)

    def lose(self, reason: WorkerLost) -> None:
        """The worker is gone: the receiver learns it."""
        if self.receiver is not None:
            self.receiver.worker_lost(self, reason)
