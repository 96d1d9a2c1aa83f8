"""The pool of worker processes, owned by the daemon's trio nursery, and the leases on them.

Workers are forked by the zygote ahead of demand. ``acquire`` leases a slot in
the least-loaded live worker of the execution's tenant (the token that
authenticated it: tenants never share a process unless the operator allows
it); when all are full it claims a spare (a started worker no tenant owns yet),
and the pool starts another spare in its place; with neither, the execution
waits for room, in the order asked. The pool keeps ``warm`` spares ready.

One relay task per worker follows it from its start to its end: the reactor
reads its channel meanwhile (``workers.py``), and the pool routes each frame to
its slot's lease; the reactor also watches the process for its exit, and reads
the zygote's reports (``zygote_client.py``), so a worker's start and end wake
no other task. When a worker dies, every execution it held learns at once
(``WorkerLost``) and the pool replaces it. A lease given up before its
execution finished (timeout, cancel, host gone) is abandoned: the worker is
told to abort it; one that has not complied within ``abandon_grace`` takes no
new executions, and is killed only if the execution is still held
``STUCK_KILL_S`` later, once every other execution it hosts has ended. A worker that sends anything
malformed is killed. An execution whose worker dies before answering its run
(no tool call, no log line, no result: nothing of it reached the host) is
placed on another worker, once, by its connection. Workers are retired after
``lifetime`` executions (1 in the hardened profile: a fresh process each).
Where each worker serves one execution, a claimed spare's replacement waits
for that execution's end (at most ``REPLACE_AFTER_S``) while another spare is
ready: forking and starting a worker takes milliseconds of CPU, which would
otherwise be taken from the execution itself.
Workers are followed through pidfds: they are the zygote's children, and a
pidfd cannot signal a recycled PID. Every worker exit is one log line saying
why, and is counted by reason in ``exit_reasons`` (``workers.exit_cause``).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections import deque
from collections.abc import Callable
from typing import Final

import trio

from ...protocol import ipc
from ..machine import usable_cores
from ..net.reactor import READ, Reactor, Timer
from . import reaper
from .sharing import REVIEW_S, Shares, Sharing
from .worker import (
    READY_TIMEOUT_S,
    STOPPED,
    STUCK_KILL_S,
    TENANT_IDLE_S,
    ChannelClosed,
    ExitCause,
    Lease,
    StopReason,
    Worker,
    WorkerLost,
    exit_cause,
)
from .zygote_client import ZygoteClient

log = logging.getLogger(__name__)

# A worker whose channel closed this long ago and that has not exited is killed.
CLOSED_EXIT_S: Final = 1.0
# As the pool stops, how long it waits for the workers it killed to have exited.
STOP_WAIT_S: Final = 5.0
# Workers of one execution each: the longest a claimed spare's replacement waits for the execution's
# end, while another spare is ready (a short execution ends first, a long one stops waiting).
REPLACE_AFTER_S: Final = 0.05
# After a worker fails to start, the pause before the next start: doubled after each failure in a
# row, this many times at most (0.5 s to 8 s), so that workers that cannot start do not flood the log.
START_RETRY_S: Final = 0.5
START_RETRY_DOUBLINGS: Final = 4


class WorkerPool:
    """Leases slots in workers and keeps enough workers started."""

    def __init__(
        self,
        *,
        warm: int,
        max_workers: int,
        capacity: int,
        lifetime: int,
        max_output_bytes: int,
        worker_args: list[str],
        abandon_grace: float,
        reactor: Reactor,
        shares: Shares | None = None,
    ) -> None:
        """``shares``: how many guests each of the named active tenants may run at once
        (``sharing.py``); None: workers do not share a machine between tenants, or each runs
        one guest."""
        # A worker start (fork, confinement, first runtime) costs milliseconds of CPU: under
        # a burst, starting one per waiting execution at once would starve the executions
        # of the CPU they wait for.
        self.max_starting = usable_cores()
        self.warm = warm
        self.max_workers = max(max_workers, warm, 1)
        self.capacity = max(capacity, 1)
        self.lifetime = lifetime or math.inf
        self.max_output_bytes = max_output_bytes  # bounds what each worker may send (``Worker``)
        self.abandon_grace = abandon_grace
        self.reactor = reactor  # reads the workers' channels and batches what is written to them
        self.sharing = Sharing(shares) if shares is not None else None
        self.zygote = ZygoteClient(worker_args, reactor, on_crash=self._retire_exposed)
        self.workers: set[Worker] = set()
        self.starting = 0  # worker starts under way
        # Workers of one execution each, claimed while another spare was ready, whose replacement
        # waits for their execution's end (see ``_defer``); the timer ends the wait.
        self._deferred: dict[Worker, Timer] = {}
        self._waiting: deque[tuple[str, Callable[[Lease], None]]] = deque()  # tenant, and whom to give a slot
        self._serving = False  # _serve_waiting is under way
        self.failed_starts = 0  # worker starts that failed since the last one that did not
        self.exits = 0  # worker processes that exited (and were replaced)
        self.exit_reasons: dict[str, int] = {}  # the same by ExitCause.reason (a bounded set)
        self._wake_spawner = trio.Event()  # while the pool starts: a change, perhaps a spare ready
        self._up = False  # the warm spares were ready once: ``run`` only retires idle workers from then on
        self._nursery: trio.Nursery | None = None
        # Called with a tenant and the CPU seconds its workers spent since last counted (``count_cpu``).
        self.cpu_spent: Callable[[str, float], None] | None = None

    @property
    def pids(self) -> list[int]:
        """The zygotes' and the live workers' PIDs."""
        return [*self.zygote.pids, *(worker.pid for worker in self.workers)]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the pool topped up until cancelled; reports started once ``warm`` workers are ready."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(reaper.reap_on_exits, self.zygote.owned, self.zygote.exited)
            if self.sharing is not None:
                nursery.start_soon(self._review_shares)
            try:
                await self.zygote.start()
                self._top_up()
                while len(self._spares()) < self.warm:
                    await self._wait_change()
                    self._top_up()
                task_status.started()
                self._up = True
                while True:
                    with trio.move_on_at(self._next_idle_retirement()):
                        await self._wait_change()
                    self._retire_idle_tenants()
                    self._top_up()
            finally:
                self._nursery = None  # stopping: an execution let go now has nothing to abort
                killed = list(self.workers)
                for worker in killed:
                    worker.kill("shutdown")
                await self._wait_exited(killed)
                await self.zygote.aclose()

    @staticmethod
    async def _wait_exited(workers: list[Worker]) -> None:
        """Until each of ``workers``, killed, has exited (at most ``STOP_WAIT_S``): a daemon that has
        stopped leaves no worker behind. A killed process still runs its own exit, at the workers'
        lowered priority, which a loaded machine can make take a while."""
        with trio.move_on_after(STOP_WAIT_S) as scope:
            scope.shield = True
            while not all(worker.exited() for worker in workers):
                await trio.sleep(0.005)

    def _changed(self) -> None:
        """What the pool's size depends on changed: start the workers now missing. Once the pool is
        up this wakes no task (an execution's start or end, a worker's, would each cost one)."""
        if self._nursery is not None:
            self._top_up()
        if not self._up:
            self._wake_spawner.set()

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
        spares = len(self._spares())
        ready = spares + (len(self._deferred) if spares else 0)  # with none ready, nothing waits
        while (
            ready + self.starting < wanted
            and len(self.workers) + self.starting < self.max_workers
            and self.starting < self.max_starting
        ):
            self.starting += 1
            self._nursery.start_soon(self._spawn)

    def _retire_idle_tenants(self) -> None:
        now = trio.current_time()
        for worker in list(self.workers):
            if self._idle_tenant_worker(worker) and worker.idle_since + TENANT_IDLE_S <= now:
                self._retire(worker, "idle")

    def _next_idle_retirement(self) -> float:
        """When the next tenant's worker idle now reaches ``TENANT_IDLE_S``, and ``TENANT_IDLE_S`` from
        now at the latest: a worker that goes idle later does so that long before its own time, so
        the pool need not be woken for it (an execution's end would wake it for nothing)."""
        idle = (w.idle_since + TENANT_IDLE_S for w in self.workers if self._idle_tenant_worker(w))
        return min(idle, default=trio.current_time() + TENANT_IDLE_S)

    @staticmethod
    def _idle_tenant_worker(worker: Worker) -> bool:
        """A tenant's worker, live, with no execution, and not already on its way out."""
        return worker.tenant is not None and not worker.leases and worker.alive and not worker.retiring

    async def _spawn(self) -> None:
        """Start a worker and relay its frames until it exits; after a failed start, pause before the
        next one, longer after each failure in a row (do not spin when workers cannot be started)."""
        await trio.lowlevel.checkpoint_if_cancelled()  # the pool stops: no fork now
        try:
            worker = await self._fork_worker()
        except OSError:
            worker = None
        if worker is not None:
            await self._relay(worker)
        if worker is None or not worker.ready:
            self.failed_starts += 1
            await trio.sleep(START_RETRY_S * 2 ** min(self.failed_starts - 1, START_RETRY_DOUBLINGS))
            self.starting -= 1
            self._changed()

    async def _fork_worker(self) -> Worker:
        """A worker just forked: ``_relay`` waits for its Ready."""
        pid, channel = await self.zygote.fork()
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            pidfd = -1  # exited at once: its channel reads as closed, its status comes from the zygote
        assert self._nursery is not None
        return Worker(pid, pidfd, channel, self.max_output_bytes, self.reactor, self._nursery.start_soon)

    async def _relay(self, worker: Worker) -> None:
        """Follow the worker from its start: the reactor reads its channel (routed by ``_route``)
        until it ends, then every lease left learns; and it watches the process (its pidfd) for
        its exit (``_exited``). Once both have ended, count and log how it ended. Nothing else
        waits: a task and its cancel scopes per worker cost more than the reactor's callbacks.

        The channel is read to its end even after the process exits: the last
        messages of its executions may still be buffered there.
        """
        held = 0  # executions it hosted when its channel ended
        try:
            try:
                if worker.pidfd >= 0:
                    self.reactor.register(worker.pidfd, READ, lambda _mask: self._exited(worker))
                else:
                    self._exited(worker)
                worker.attach(self._route)
                try:
                    await self._ready(worker)
                    await worker.ended.wait()
                    assert worker.end is not None
                    raise worker.end
                except WorkerLost as exc:
                    held = sum(not lease.finished for lease in worker.leases.values())
                    await self._lost(worker, exc)
                if not worker.gone.is_set():  # (waiting on an event already set is a pass through trio's scheduler)
                    await worker.gone.wait()
            finally:
                worker.close()
                self._exited(worker)  # also when the pool stops: the worker is stopped with it
            with trio.CancelScope(shield=True):  # bounded: a pool that stops meanwhile still learns it
                status, cpu_limit, cpu_seconds = await self.zygote.exit_status(worker.pid)
            worker.cause = exit_cause(status, worker.kill_reason, cpu_limit)
            if cpu_seconds is not None:
                self.count_cpu(worker, cpu_seconds)
        finally:
            self._count_exit(worker, held)  # the pool stopped first: ``shutdown``

    def _route(self, worker: Worker, slot: int, message: ipc.FromWorker) -> None:
        """Hand a worker's frame to whom it concerns; WorkerLost if it concerns nobody it may."""
        if not worker.ready:
            if isinstance(message, ipc.StartFailed):  # it exits next: its exit status says how
                worker.start_failure = message.reason
                return
            if not isinstance(message, ipc.Ready):
                raise WorkerLost("worker did not start with Ready")
            if worker.alive:  # not already killed for being late
                self._started(worker)
            return
        if slot == 0 and isinstance(message, ipc.Heaps):
            worker.measured(message)
            return
        lease = worker.leases.get(slot)
        if lease is None or lease.finished or not isinstance(message, ipc.ToolCalls | ipc.Finished):
            raise WorkerLost(f"worker sent {type(message).__name__} for slot {slot}")
        lease.answered = True
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
        lease.send(ipc.Evict())
        return lease, size

    async def _ready(self, worker: Worker) -> None:
        """Wait for the worker's Ready (``_started``), or its channel's end, within ``READY_TIMEOUT_S``."""
        with trio.move_on_after(READY_TIMEOUT_S):
            await worker.settled.wait()
        if not worker.ready and worker.end is None:
            worker.kill("start_timeout")
            raise WorkerLost(f"worker not ready within {READY_TIMEOUT_S:g} s")

    def _started(self, worker: Worker) -> None:
        """It said Ready: it takes executions."""
        worker.ready = True
        worker.settled.set()
        self.failed_starts = 0
        self.starting -= 1
        self.workers.add(worker)
        if self.zygote.exposed(worker.pid):  # forked before the daemon learned of the crash
            self._retire(worker, "zygote_renewed")
        self._serve_waiting()
        self._changed()

    async def _lost(self, worker: Worker, exc: WorkerLost) -> None:
        """Every execution the worker still hosts learns it is lost, and the worker is killed, unless
        its channel closed because it is exiting on its own: then its exit status says why."""
        worker.alive = False
        for lease in list(worker.leases.values()):  # each receiver lets its lease go as it learns
            if not lease.finished and not lease.abandoned:
                lease.lose(exc)
        if isinstance(exc, ChannelClosed) and not worker.gone.is_set():
            with trio.move_on_after(CLOSED_EXIT_S):
                await worker.gone.wait()
        worker.kill("misbehaved")

    def _exited(self, worker: Worker) -> None:
        """The worker's process has exited (its pidfd is readable; or it is no longer followed, as
        the pool stops): forget it. Once only."""
        if worker.gone.is_set():
            return
        worker.alive = False
        if worker.pidfd >= 0:
            self.reactor.unregister(worker.pidfd)
            os.close(worker.pidfd)
            worker.pidfd = -1
        worker.gone.set()
        self.workers.discard(worker)
        self._undefer(worker)
        self._share_out()
        self._changed()

    def count_cpu(self, worker: Worker, total_s: float) -> None:
        """``worker`` has spent ``total_s`` CPU seconds over its life (read from /proc while it runs, or
        reported at its exit, crash or not): its tenant's ``cpu_spent`` is what it spent since last counted."""
        spent = total_s - worker.cpu_counted
        if spent <= 0:
            return
        worker.cpu_counted = total_s
        if worker.tenant and self.cpu_spent is not None:
            self.cpu_spent(worker.tenant, spent)

    def _count_exit(self, worker: Worker, held: int) -> None:
        """Count the worker's exit by reason and say, in one line, how it ended."""
        cause = worker.cause or ExitCause("shutdown", *STOPPED["shutdown"])
        self.exits += 1
        self.exit_reasons[cause.reason] = self.exit_reasons.get(cause.reason, 0) + 1
        log.log(
            cause.level,
            "worker %d %s%s; executions held: %d%s",
            worker.pid,
            "" if worker.ready else f"failed to start ({worker.start_failure or 'no reason given'}): ",
            cause.text,
            held,
            "" if cause.reason in {"idle", "shutdown"} else "; replaced",
            extra={
                "worker_pid": worker.pid,
                "exit_reason": cause.reason,
                "executions_held": held,
                "executions_served": worker.started,
                **({"start_failure": worker.start_failure} if worker.start_failure else {}),
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
        self._changed()

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
        spares = [] if candidates else self._spares()
        if spares:
            spare = spares[0]
            spare.tenant = tenant
            candidates = [spare]
            if self.lifetime == 1 and len(spares) > 1:
                self._defer(spare)
            self._changed()  # a spare fewer: start its replacement
        if not candidates:
            return None
        worker = min(candidates, key=lambda w: len(w.leases))
        lease = worker.lease()
        if self.sharing is not None and tenant not in self.sharing.active:
            self._share_out()  # the tenant is active from now: its Share goes before its Run
        if worker.started >= self.lifetime:
            worker.retiring = "retired"
            self._changed()
        return lease

    def _defer(self, worker: Worker) -> None:
        """Start ``worker``'s replacement only once its one execution has ended, or
        ``REPLACE_AFTER_S`` from now."""
        deadline = self.reactor.now() + REPLACE_AFTER_S
        self._deferred[worker] = self.reactor.call_at(deadline, functools.partial(self._replace, worker))

    def _replace(self, worker: Worker) -> None:
        """``worker``'s replacement need wait no more: start it now if the pool lacks a spare."""
        if self._undefer(worker):
            self._changed()

    def _undefer(self, worker: Worker) -> bool:
        """Whether ``worker``'s replacement was waiting (it waits no more)."""
        timer = self._deferred.pop(worker, None)
        if timer is not None:
            timer.cancel()
        return timer is not None

    def _share_out(self) -> None:
        if self.sharing is not None:
            self.sharing.share_out(self.workers, trio.current_time())

    async def _review_shares(self) -> None:
        """Tenants that stopped being active leave the sharing within ``REVIEW_S``."""
        while True:
            await trio.sleep(REVIEW_S)
            self._share_out()

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
        lease.send(ipc.Abort())
        await trio.sleep(self.abandon_grace)
        if worker.leases.get(lease.slot) is not lease:
            return
        # Slow to let go (a starved CPU) or stuck: take no new executions, so that the
        # worker ends with its last one; kill it only if the slot is still held much later.
        log.warning("worker %d has not let go of an aborted execution; retiring it", worker.pid)
        self._retire(worker, "slow_abort")
        await trio.sleep(STUCK_KILL_S)
        if worker.leases.get(lease.slot) is lease:
            worker.stuck = True
            self._kill_stuck(worker)

    @staticmethod
    def _kill_stuck(worker: Worker) -> None:
        """Kill a stuck worker (a built-in loop the interrupt cannot stop) once every execution it
        hosts is abandoned: killing it sooner would fail the others, which run on meanwhile."""
        if worker.stuck and all(lease.abandoned for lease in worker.leases.values()):
            worker.kill("stuck")

    def _forget(self, lease: Lease) -> None:
        worker = lease.worker
        worker.leases.pop(lease.slot, None)
        self._kill_stuck(worker)
        if not worker.leases:
            worker.idle_since = trio.current_time()
            if worker.retiring:
                # Killed once the reactor's pass has written what it sends (the last execution's
                # ``done`` among it): signalling a process, and its exit, need not come first.
                worker.alive = False
                self.reactor.later(functools.partial(worker.kill, worker.retiring))
                self._replace(worker)
        self._serve_waiting()

    def _retire_exposed(self) -> None:
        """(The zygote client, as a worker crashed.) Retire the workers that share its layout, which
        the crash may have shown: no new execution starts in them, and each stops after its last."""
        for worker in list(self.workers):
            if self.zygote.exposed(worker.pid):
                self._retire(worker, "zygote_renewed")

    def _retire(self, worker: Worker, reason: StopReason) -> None:
        worker.retiring = worker.retiring or reason
        if not worker.leases:
            worker.kill(worker.retiring)
        self._changed()
