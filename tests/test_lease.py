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


def _worker(nursery: trio.Nursery | None = None) -> tuple[Worker, socket.socket]:
    """A worker's channel (no process, no reactor running: what it sends is written at once);
    its writer tasks start in ``nursery``."""
    ours, theirs = socket.socketpair()
    return Worker(0, -1, ours, 1 << 20, Reactor(), nursery.start_soon if nursery else _no_tasks), theirs


def _no_tasks(task: object) -> None:
    raise AssertionError(f"{task!r} started: this test's channel always has room")


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
    settles = [ipc.Settle(call_id=n, ok=True, value=b"x" * 50_000) for n in range(40)]  # ~2 MB: more than the buffers
    received = bytearray()
    async with trio.open_nursery() as nursery:
        worker, other = _worker(nursery)
        with other:
            other.setblocking(False)
            for settle in settles:
                worker.send(7, settle)
            assert worker._backlog  # the channel did not take them all: a writer task has the rest
            with trio.fail_after(10):
                while len(_frames(bytes(received))) < len(settles):
                    await trio.lowlevel.wait_readable(other)
                    received += other.recv(1 << 20)
                while worker._writing:  # the writer ends once the backlog is written
                    await trio.sleep(0.01)
            worker.send(8, ipc.Settle(call_id=40, ok=True))  # room again: written at once
            with trio.fail_after(10):
                await trio.lowlevel.wait_readable(other)
            received += other.recv(1 << 20)
    frames = [(slot, message.call_id) for slot, message in _frames(bytes(received))]
    assert frames == [(7, n) for n in range(40)] + [(8, 40)]


async def test_a_worker_that_stops_reading_its_channel_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "SEND_TIMEOUT_S", 0.2)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            worker, other = _worker(nursery)
            with other:
                while worker.alive:
                    worker.send(1, ipc.Settle(call_id=1, ok=True, value=b"x" * 100_000))
                    await trio.sleep(0.05)
    assert not worker.alive


async def test_a_channel_closed_while_its_writer_waits_stops_the_writer() -> None:
    """The pool closes a worker's channel as it ends: a writer waiting for room stops at once."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            worker, other = _worker(nursery)
            with other:
                worker.send(1, ipc.Settle(call_id=1, ok=True, value=b"x" * 4_000_000))
                await trio.sleep(0.05)
                assert worker._writing
                worker.close()
        assert not worker._writing


async def test_what_one_pass_of_the_reactor_sends_a_worker_goes_in_one_write() -> None:
    """Frames sent while the reactor serves a pass are written together at its end."""
    reactor = Reactor()
    ours, theirs = socket.socketpair()
    worker = Worker(0, -1, ours, 1 << 20, reactor, _no_tasks)
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
