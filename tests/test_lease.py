"""``Lease`` hands its worker's messages to its receiver at once, and ``Worker.send`` writes frames
whole and in order whether or not the channel takes them at once (real socketpairs)."""

from __future__ import annotations

import socket

import pytest
import trio

from execbox_runner.daemon.net.reactor import Reactor
from execbox_runner.daemon.pool import worker as workers
from execbox_runner.daemon.pool.worker import LEASE_BACKLOG_BYTES, Lease, Worker, WorkerLost
from execbox_runner.protocol import ipc


class Receiver:
    """What a connection would be told, recorded; ``backlog`` is what its host has not read."""

    def __init__(self, backlog: int = 0) -> None:
        self.backlog = backlog
        self.messages: list[ipc.ToolCalls | ipc.Finished] = []
        self.lost: list[str] = []

    def worker_message(self, lease: Lease, message: ipc.ToolCalls | ipc.Finished) -> None:
        self.messages.append(message)

    def worker_lost(self, lease: Lease, reason: WorkerLost) -> None:
        self.lost.append(str(reason))


def _worker() -> tuple[Worker, socket.socket]:
    """A worker's channel (no process, no reactor running: what it sends is written at once)."""
    ours, theirs = socket.socketpair()
    return Worker(0, -1, ours, 1 << 20, Reactor()), theirs


def _calls(call_id: int) -> ipc.ToolCalls:
    return ipc.ToolCalls(calls=[], logs=[f"line {call_id}"])


async def test_messages_reach_the_receiver_at_once_in_order_and_a_loss_too() -> None:
    worker, other = _worker()
    with other:
        lease, receiver = Lease(worker, 1), Receiver()
        lease.deliver(_calls(1))  # no receiver yet (not leased to anyone): dropped
        lease.receiver = receiver
        lease.deliver(_calls(2))
        lease.deliver(_calls(3))
        lease.lose(WorkerLost("gone"))
        assert [message.logs for message in receiver.messages] == [["line 2"], ["line 3"]]
        assert receiver.lost == ["gone"]


async def test_a_worker_flooding_a_host_that_does_not_read_is_refused() -> None:
    worker, other = _worker()
    with other:
        lease = Lease(worker, 1)
        lease.receiver = Receiver(backlog=LEASE_BACKLOG_BYTES)
        lease.deliver(_calls(1))  # at the bound: still taken
        lease.receiver = Receiver(backlog=LEASE_BACKLOG_BYTES + 1)
        with pytest.raises(WorkerLost, match="flooded slot 1"):
            lease.deliver(_calls(2))


def _frames(data: bytes) -> list[tuple[int, ipc.ToWorker]]:
    frames = ipc.Unframer()
    frames.feed(data)
    found = []
    while (body := frames.next()) is not None:
        found.append(ipc.to_worker_decoder.decode(body))
    return found


async def test_frames_the_channel_does_not_take_at_once_follow_whole_and_in_order() -> None:
    worker, other = _worker()
    settles = [ipc.Settle(call_id=n, ok=True, value=b"x" * 50_000) for n in range(40)]  # ~2 MB: more than the buffers
    with other:
        other.setblocking(False)
        received = bytearray()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.write_backlog)
            for settle in settles:
                worker.send(7, settle)
            assert worker._backlog  # the channel did not take them all: the writer has the rest
            with trio.fail_after(10):
                while len(_frames(bytes(received))) < len(settles):
                    await trio.lowlevel.wait_readable(other)
                    received += other.recv(1 << 20)
            nursery.cancel_scope.cancel()
    assert [(slot, message.call_id) for slot, message in _frames(bytes(received))] == [(7, n) for n in range(40)]


async def test_a_worker_that_stops_reading_its_channel_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "SEND_TIMEOUT_S", 0.2)
    worker, other = _worker()
    with other:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(worker.write_backlog)
                while worker.alive:
                    worker.send(1, ipc.Settle(call_id=1, ok=True, value=b"x" * 100_000))
                    await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
    assert not worker.alive


async def test_what_one_pass_of_the_reactor_sends_a_worker_goes_in_one_write() -> None:
    """Frames sent while the reactor serves a pass are written together at its end."""
    reactor = Reactor()
    ours, theirs = socket.socketpair()
    worker = Worker(0, -1, ours, 1 << 20, reactor)
    with theirs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reactor.run)

            unsent: list[bool] = []

            def send_three() -> None:
                for call_id in range(3):
                    worker.send(call_id + 1, ipc.Settle(call_id=call_id, ok=True))
                try:
                    theirs.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
                except BlockingIOError:
                    unsent.append(True)  # nothing written yet, within the pass

            reactor.call_at(trio.current_time(), send_three)
            with trio.fail_after(10):
                await trio.lowlevel.wait_readable(theirs)
            data = theirs.recv(1 << 16)
            nursery.cancel_scope.cancel()
    assert unsent == [True]
    assert [(slot, message.call_id) for slot, message in _frames(data)] == [(1, 0), (2, 1), (3, 2)]
