"""Spares: where each worker serves one execution (``hardened``), a claimed spare's replacement
waits for that execution's end while another spare is ready, so that forking and starting the next
worker does not take the CPU from the execution; it waits at most ``REPLACE_AFTER_S``, and not at
all once no spare is left. Real pools in the test's process, real workers."""

from __future__ import annotations

import pytest
import trio

from execbox_runner.daemon.pool import pool as pool_module
from execbox_runner.daemon.pool.pool import WorkerPool
from execbox_runner.protocol import ipc

from .guestkit import run_message
from .poolkit import WAIT_S, Execution, running_pool

PARKED = run_message("await tools.echo(1); 2", providers=[("tools", ["echo"])], budget=60.0)


async def spares_back(pool: WorkerPool, count: int) -> None:
    with trio.fail_after(WAIT_S):
        while len(pool._spares()) < count or pool.starting:
            await trio.sleep(0.01)


async def parked(pool: WorkerPool) -> tuple[Execution, int]:
    """An execution leased a spare and awaiting its tool call; the call's id."""
    execution = Execution(pool, "tenant")
    (await execution.leased()).send(PARKED)
    message = await execution.receive()
    assert isinstance(message, ipc.ToolCalls)
    return execution, message.calls[0][0]


async def test_a_replacement_waits_for_the_execution_while_another_spare_is_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "REPLACE_AFTER_S", WAIT_S)  # so that only the execution's end ends the wait
    async with running_pool(warm=2, lifetime=1) as pool:
        await spares_back(pool, 2)
        execution, call_id = await parked(pool)
        assert (len(pool._spares()), pool.starting) == (1, 0)
        lease = execution.lease
        assert lease is not None
        lease.send(ipc.Settle(call_id=call_id, ok=True, value=b"1"))
        assert isinstance(await execution.receive(), ipc.Finished)
        pool.release(lease)
        assert pool.starting == 1  # started as the execution ended, not once its worker exited
        await spares_back(pool, 2)


async def test_a_replacement_waits_no_longer_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "REPLACE_AFTER_S", 0.2)
    async with running_pool(warm=2, lifetime=1) as pool:
        await spares_back(pool, 2)
        execution, _ = await parked(pool)
        await spares_back(pool, 2)  # while the execution still awaits its tool
        assert execution.lease is not None and not execution.lease.finished


async def test_with_no_spare_left_replacements_start_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "REPLACE_AFTER_S", WAIT_S)
    async with running_pool(warm=2, lifetime=1) as pool:
        await spares_back(pool, 2)
        first = Execution(pool, "tenant")
        assert pool.starting == 0
        second = Execution(pool, "tenant")
        assert pool.starting == 2  # the first's replacement too: no spare is ready now
        assert first.lease is not None and second.lease is not None
        assert first.lease.worker is not second.lease.worker


async def test_workers_of_many_executions_replace_a_claimed_spare_at_once() -> None:
    async with running_pool(warm=2, lifetime=2) as pool:
        await spares_back(pool, 2)
        Execution(pool, "tenant")
        assert pool.starting == 1
