"""``Reactor``: ready sockets' handlers and due timers run in its one task; a cancelled timer
never runs; a failing handler costs its own socket only (real socketpairs)."""

from __future__ import annotations

import socket

import pytest
import trio

from execbox_runner.daemon.net import reactor as reactor_module
from execbox_runner.daemon.net.reactor import READ, Reactor

WAIT_S = 10.0


async def test_timers_run_in_deadline_order_and_a_cancelled_one_never() -> None:
    reactor = Reactor()
    ran: list[str] = []
    now = trio.current_time()
    reactor.call_at(now + 0.03, lambda: ran.append("third"))
    reactor.call_at(now + 0.01, lambda: ran.append("first"))
    reactor.call_at(now + 0.02, lambda: ran.append("cancelled")).cancel()
    reactor.call_at(now + 0.02, lambda: ran.append("second"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        with trio.fail_after(WAIT_S):
            while len(ran) < 3:
                await trio.sleep(0.01)
        await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    reactor.close()
    assert ran == ["first", "second", "third"]


async def test_a_timer_is_on_time_while_no_socket_is_ready() -> None:
    reactor = Reactor()
    fired: list[float] = []
    deadline = trio.current_time() + 0.05
    reactor.call_at(deadline, lambda: fired.append(trio.current_time()))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        with trio.fail_after(WAIT_S):
            while not fired:
                await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    reactor.close()
    assert fired[0] >= deadline


async def test_cancelled_timers_do_not_pile_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-armed timers leave cancelled ones far in the future: the heap is rebuilt without them,
    and the live ones still run."""
    monkeypatch.setattr(reactor_module, "COMPACT_AFTER", 10)
    reactor = Reactor()
    ran: list[int] = []
    now = trio.current_time()
    live = [reactor.call_at(now + 0.01, lambda n=n: ran.append(n)) for n in range(3)]
    for _ in range(100):
        reactor.call_at(now + 3600, lambda: ran.append(-1)).cancel()
    assert len(reactor._timers) < 30
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        with trio.fail_after(WAIT_S):
            while len(ran) < len(live):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    reactor.close()
    assert sorted(ran) == [0, 1, 2]


async def test_a_failing_handler_drops_its_socket_and_the_others_are_served(caplog: pytest.LogCaptureFixture) -> None:
    reactor = Reactor()
    bad, bad_peer = socket.socketpair()
    good, good_peer = socket.socketpair()
    received: list[bytes] = []

    def fail(_mask: int) -> None:
        raise RuntimeError("a bug")

    reactor.register(bad.fileno(), READ, fail)
    reactor.register(good.fileno(), READ, lambda _mask: received.append(good.recv(100)))
    bad_peer.send(b"x")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        await trio.sleep(0.05)  # the bad one's handler has run (and failed) by now
        good_peer.send(b"still served")
        with trio.fail_after(WAIT_S):
            while not received:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert received == [b"still served"]
    assert bad.fileno() not in reactor._handlers
    assert any("handler failed" in record.getMessage() for record in caplog.records)
    reactor.unregister(good.fileno())
    reactor.close()
    for sock in (bad, bad_peer, good, good_peer):
        sock.close()


async def test_what_a_pass_defers_runs_at_its_end_in_order() -> None:
    """A handler's ``later`` callbacks run once the pass's handlers have (a socket's writes), in
    the order asked for; outside a pass they run at once."""
    reactor = Reactor()
    ran: list[str] = []
    reactor.later(lambda: ran.append("outside"))
    assert ran == ["outside"]
    ours, theirs = socket.socketpair()

    def ready(_mask: int) -> None:
        ours.recv(1)
        reactor.later(lambda: ran.append("write a"))
        reactor.later(lambda: ran.append("write b"))
        ran.append("handler")

    reactor.register(ours.fileno(), READ, ready)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        theirs.send(b"x")
        with trio.fail_after(WAIT_S):
            while len(ran) < 4:
                await trio.sleep(0.005)
        nursery.cancel_scope.cancel()
    reactor.close()
    ours.close()
    theirs.close()
    assert ran == ["outside", "handler", "write a", "write b"]


class PingPong:
    """Two socketpairs whose handlers hand one byte back and forth: a reactor that always has a
    socket ready, one per pass, until ``passes`` handlers have run."""

    def __init__(self, reactor: Reactor, passes: int) -> None:
        self.left, self.left_peer = socket.socketpair()
        self.right, self.right_peer = socket.socketpair()
        self.served = 0
        self.done = trio.Event()
        self._passes = passes
        reactor.register(self.left.fileno(), READ, lambda _mask: self._hand(self.left, self.right_peer))
        reactor.register(self.right.fileno(), READ, lambda _mask: self._hand(self.right, self.left_peer))
        self.left_peer.send(b"x")

    def _hand(self, source: socket.socket, to: socket.socket) -> None:
        source.recv(1)
        self.served += 1
        if self.served < self._passes:
            to.send(b"x")
        else:
            self.done.set()

    def close(self) -> None:
        for sock in (self.left, self.left_peer, self.right, self.right_peer):
            sock.close()


class Steps(trio.abc.Instrument):
    """How often trio ran one task (each a pass through trio's scheduler for it)."""

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


async def test_a_busy_reactor_serves_its_sockets_without_a_trip_through_trio_for_each() -> None:
    """While sockets keep becoming ready, the reactor waits on its epoll itself: a pass through
    trio's scheduler per ``PASSES_PER_TURN`` passes served (one each before)."""
    reactor = Reactor()
    pingpong = PingPong(reactor, passes=5000)
    steps = Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            steps.task = await nursery.start(_run_reactor, reactor)
            with trio.fail_after(WAIT_S):
                await pingpong.done.wait()
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
        reactor.close()
        pingpong.close()
    assert pingpong.served == 5000
    assert steps.steps < pingpong.served / (reactor_module.PASSES_PER_TURN - 1), (steps.steps, pingpong.served)


async def test_a_reactor_kept_busy_still_lets_trio_run_its_other_tasks() -> None:
    """A reactor that always has a socket ready hands the thread back to trio every few passes:
    another task sleeping 1 ms at a time keeps running meanwhile."""
    reactor = Reactor()
    pingpong = PingPong(reactor, passes=2_000_000)  # a bound in case the reactor never yields
    turns_while_busy = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        with trio.fail_after(WAIT_S):
            while turns_while_busy < 20 and not pingpong.done.is_set():
                await trio.sleep(0.001)
                turns_while_busy += pingpong.served > 0 and not pingpong.done.is_set()
        nursery.cancel_scope.cancel()
    reactor.close()
    pingpong.close()
    assert turns_while_busy == 20, f"trio's other task ran {turns_while_busy} times while the reactor was busy"


async def _run_reactor(reactor: Reactor, *, task_status: trio.TaskStatus[trio.lowlevel.Task]) -> None:
    task_status.started(trio.lowlevel.current_task())
    await reactor.run()
