"""A lease's mailbox: the worker's messages for one execution reach its one receiving task in
order, a lost worker is raised there, a cancelled wait loses nothing, and a flood is refused."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing

from execbox_runner.daemon.pool import LEASE_BACKLOG, Lease, Worker, WorkerLost
from execbox_runner.protocol import ipc


def _lease() -> tuple[Lease, socket.socket]:
    ours, theirs = socket.socketpair()
    worker = Worker(0, -1, trio.SocketStream(trio.socket.from_stdlib_socket(ours)), 1 << 20)
    return Lease(worker, 1), theirs


def _calls(call_id: int) -> ipc.ToolCalls:
    return ipc.ToolCalls(calls=[], logs=[f"line {call_id}"])


async def test_messages_arrive_in_order_whether_the_receiver_waits_or_not() -> None:
    lease, other = _lease()
    with other:
        lease.deliver(_calls(1))
        lease.deliver(_calls(2))
        assert (await lease.receive()).logs == ["line 1"]
        assert (await lease.receive()).logs == ["line 2"]
        async with trio.open_nursery() as nursery:
            received: list[ipc.ToolCalls | ipc.Finished] = []

            async def receive() -> None:
                received.append(await lease.receive())

            nursery.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            assert received == []
            lease.deliver(_calls(3))
        assert [message.logs for message in received] == [["line 3"]]


async def test_a_lost_worker_is_raised_to_the_receiver() -> None:
    lease, other = _lease()
    with other:
        async with trio.open_nursery() as nursery:
            raised: list[BaseException] = []

            async def receive() -> None:
                try:
                    await lease.receive()
                except WorkerLost as exc:
                    raised.append(exc)

            nursery.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            lease.lose(WorkerLost("gone"))
        assert [str(exc) for exc in raised] == ["gone"]


async def test_a_cancelled_wait_leaves_the_next_message_for_the_next_receive() -> None:
    lease, other = _lease()
    with other:
        with trio.move_on_after(0.01) as scope:
            await lease.receive()
        assert scope.cancelled_caught
        lease.deliver(_calls(4))  # must not wake the cancelled task, nor be lost
        assert (await lease.receive()).logs == ["line 4"]


async def test_a_worker_flooding_one_slot_is_refused() -> None:
    lease, other = _lease()
    with other:
        for call_id in range(LEASE_BACKLOG):
            lease.deliver(_calls(call_id))
        with pytest.raises(WorkerLost, match="flooded slot 1"):
            lease.deliver(_calls(LEASE_BACKLOG))
