"""A real worker pool in the test's own process, and executions that lease slots in it as
connections do."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import time
from collections.abc import AsyncIterator

import trio

from execbox_runner.daemon.config import Settings
from execbox_runner.daemon.net.reactor import Reactor
from execbox_runner.daemon.pool import reaper
from execbox_runner.daemon.pool.pool import WorkerPool
from execbox_runner.daemon.pool.reaper import PR_SET_CHILD_SUBREAPER
from execbox_runner.daemon.pool.worker import Lease, WorkerLost
from execbox_runner.daemon.pool.zygote_client import RENEW_AFTER_FORKS, ZygoteClient
from execbox_runner.daemon.report import worker_arguments
from execbox_runner.protocol import ipc

WAIT_S = 10.0  # a bound on how long a wait may take, not a measurement


@contextlib.asynccontextmanager
async def running_pool(*worker_args: str, warm: int = 1, lifetime: int = 2) -> AsyncIterator[WorkerPool]:
    """A real pool in this process (its reactor reading the workers' channels), which becomes a
    subreaper for it and stops being one after; ``lifetime``: executions per worker."""
    reactor = Reactor()
    pool = WorkerPool(
        warm=warm,
        max_workers=4,
        capacity=8,
        lifetime=lifetime,
        max_output_bytes=1024,  # the least there is: frames of about 1 MiB
        worker_args=[*worker_arguments(Settings()), *worker_args],
        abandon_grace=2.5,
        reactor=reactor,
    )
    pids: set[int] = set()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reactor.run)
            await nursery.start(pool.run)
            yield pool
            pids.update(pool.pids)
            nursery.cancel_scope.cancel()
    finally:
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        reap(pids)


class Forks:
    """A zygote client of the test's own, and the workers it forked (PIDs, channels)."""

    def __init__(self, zygote: ZygoteClient) -> None:
        self.zygote = zygote
        self.forked: list[tuple[int, socket.socket]] = []

    async def fork(self, count: int) -> None:
        """Ask for ``count`` workers at once (bounded)."""

        async def one() -> None:
            self.forked.append(await self.zygote.fork())

        with trio.fail_after(WAIT_S):
            async with trio.open_nursery() as forks:
                for _ in range(count):
                    forks.start_soon(one)


@contextlib.asynccontextmanager
async def running_zygote(renew_after_forks: int = RENEW_AFTER_FORKS) -> AsyncIterator[Forks]:
    """A started zygote client in this process, with the reactor and the reaper a pool runs
    (this process becomes a subreaper, and stops being one after); after, its zygotes are
    ended and its workers reaped."""
    reactor = Reactor()
    forks = Forks(ZygoteClient(worker_arguments(Settings()), reactor, renew_after_forks))
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reactor.run)
            await forks.zygote.start()
            nursery.start_soon(reaper.reap_on_exits, forks.zygote.owned, forks.zygote.exited)
            yield forks
            await forks.zygote.aclose()
            nursery.cancel_scope.cancel()
    finally:
        for _, channel in forks.forked:
            channel.close()
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        reap({pid for pid, _ in forks.forked})


def reap(pids: set[int]) -> None:
    """Reap the pool's processes that came back to this process once the pool stopped (bounded)."""
    deadline = time.monotonic() + WAIT_S
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    break
            except ChildProcessError:  # not ours (yet): still its zygote's, or gone
                if not os.path.exists(f"/proc/{pid}"):
                    break
            time.sleep(0.02)


class Execution:
    """A slot leased as a connection leases one; what its worker sends it is kept for the test."""

    backlog = 0  # its host reads everything at once

    def __init__(self, pool: WorkerPool, tenant: str = "") -> None:
        self.lease: Lease | None = None
        self._received: list[ipc.ToolCalls | ipc.Finished | WorkerLost] = []
        pool.acquire(tenant, self._leased)

    def _leased(self, lease: Lease) -> None:
        self.lease = lease
        lease.receiver = self

    def worker_message(self, lease: Lease, message: ipc.ToolCalls | ipc.Finished) -> None:
        self._received.append(message)

    def worker_lost(self, lease: Lease, reason: WorkerLost) -> None:
        self._received.append(reason)

    async def leased(self) -> Lease:
        with trio.fail_after(WAIT_S):
            while self.lease is None:
                await trio.sleep(0.01)
        return self.lease

    async def receive(self, timeout: float = WAIT_S) -> ipc.ToolCalls | ipc.Finished:
        """The worker's next message (WorkerLost raised)."""
        with trio.fail_after(timeout):
            while not self._received:
                await trio.sleep(0.01)
        message = self._received.pop(0)
        if isinstance(message, WorkerLost):
            raise message
        return message
