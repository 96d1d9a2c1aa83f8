"""Readiness callbacks and timers for the daemon's sockets, run by one trio task.

A trio task per connection costs the daemon, for every execution, a task spawn,
cancel scopes for its waits, and a pass through trio's scheduler for each thing
it waits on; and a task waits on one thing at a time, so a worker's message for
a session had to wake a second task of its own. Sessions are instead callbacks:
every session socket is registered with one private epoll, whose own descriptor
the reactor's task waits on, and each ready socket's handler runs at once,
synchronously, as do the timers that fall due. One pass through trio's scheduler
then serves every socket that became ready together.

A pass through trio's scheduler costs more CPU than waiting on the epoll
directly, and a busy daemon made about one per execution (``benchmarks/throughput.py
--floor --other CHECKOUT`` compares a change to this against a checkout without it). So after a pass, the reactor waits on its epoll itself, serving
what becomes ready as it does, for as long as sockets keep becoming ready (within
``BUSY_WAIT_S`` of each other), for ``PASSES_PER_TURN`` passes at most and at most
``TRIO_TURN_S``; then trio has the thread back. Its other tasks (the pool's, the
session records' writers, the sampler, the drain, signals) so still run every few
passes, as they ran after every pass before: a session record written as fast as a
host sends it.

The reactor is a trio task like any other (in the daemon's nursery, cancelled
with it); handlers and timers run inside it, so they may use trio's clock and
start tasks in a nursery, but never await. A handler or timer that raises is
logged and its socket dropped from the reactor: one connection's bug never
reaches another.
"""

from __future__ import annotations

import heapq
import logging
import math
import select
from collections.abc import Callable
from typing import Final, NoReturn

import trio

log = logging.getLogger(__name__)

READ: Final = select.EPOLLIN
WRITE: Final = select.EPOLLOUT
MAX_EVENTS: Final = 64  # sockets served per pass (the rest on the next): the timers due run after a few ms at most
COMPACT_AFTER: Final = 1024  # cancelled timers the heap may hold before it is rebuilt without them
BUSY_WAIT_S: Final = 0.001  # after a pass, how long the reactor waits on its epoll itself for more
PASSES_PER_TURN: Final = 4  # passes served between two of trio's, at most
TRIO_TURN_S: Final = 0.002  # the longest the reactor keeps the thread from trio's other tasks


class Timer:
    """A callback at a deadline (``trio.current_time()``); ``cancel`` before it runs drops it."""

    __slots__ = ("_reactor", "callback", "deadline")

    def __init__(self, reactor: Reactor, deadline: float, callback: Callable[[], None]) -> None:
        self._reactor = reactor
        self.deadline = deadline
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        if self.callback is not None:
            self.callback = None
            self._reactor._cancelled()


class Reactor:
    """A private epoll and a heap of timers, served by ``run``."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._handlers: dict[int, Callable[[int], None]] = {}
        self._timers: list[tuple[float, int, Timer]] = []
        self._sequence = 0  # orders timers of one deadline, and never compares two Timers
        self._stale = 0  # cancelled timers still in the heap
        self._in_pass = False  # serving ready sockets and due timers now
        self._now = 0.0  # trio's clock as the socket being served became ready (see ``now``)
        self._later: list[Callable[[], None]] = []  # to run at the end of this pass

    def register(self, fd: int, events: int, handler: Callable[[int], None]) -> None:
        """Call ``handler(mask)`` whenever ``fd`` is ready for ``events`` (level-triggered)."""
        self._epoll.register(fd, events)
        self._handlers[fd] = handler

    def modify(self, fd: int, events: int) -> None:
        self._epoll.modify(fd, events)

    def unregister(self, fd: int) -> None:
        """Stop watching ``fd``: before it is closed, since epoll would go on reporting the socket
        behind a closed descriptor while another descriptor still refers to it."""
        if self._handlers.pop(fd, None) is not None and not self._epoll.closed:
            self._epoll.unregister(fd)

    def now(self) -> float:
        """trio's clock: read once for each ready socket and once for the timers of a pass (a
        handler takes microseconds, and trio's clock costs three calls), at once outside a pass."""
        return self._now if self._in_pass else trio.current_time()

    def later(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` at the end of this pass (at once outside one): what the pass sends to one
        worker goes in one write."""
        if self._in_pass:
            self._later.append(callback)
        else:
            callback()

    def call_at(self, deadline: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(self, deadline, callback)
        self._sequence += 1
        heapq.heappush(self._timers, (deadline, self._sequence, timer))
        return timer

    def _cancelled(self) -> None:
        """A timer was cancelled. Sessions re-arm theirs as they go, each time leaving one far in the
        future (an idle timeout): once most of the heap is such, it is rebuilt without them."""
        self._stale += 1
        if self._stale > COMPACT_AFTER and 2 * self._stale > len(self._timers):
            self._timers = [entry for entry in self._timers if entry[2].callback is not None]
            heapq.heapify(self._timers)
            self._stale = 0

    async def run(self) -> NoReturn:
        """Serve ready sockets and due timers until cancelled."""
        epoll_fd = self._epoll.fileno()
        while True:
            with trio.CancelScope(deadline=self._next_deadline()):
                await trio.lowlevel.wait_readable(epoll_fd)
            self._serve(self._epoll.poll(0, MAX_EVENTS))
            self._serve_while_busy()

    def _serve_while_busy(self) -> None:
        """Wait on the epoll directly and serve, while sockets keep becoming ready (see the module
        docstring): back to trio once none has for ``BUSY_WAIT_S``, after ``PASSES_PER_TURN - 1``
        more passes, or after ``TRIO_TURN_S``."""
        turn_ends = self._now + TRIO_TURN_S
        for _ in range(PASSES_PER_TURN - 1):
            if self._now >= turn_ends:
                return
            wait = min(BUSY_WAIT_S, self._next_deadline() - self._now)
            events = self._epoll.poll(max(wait, 0.0), MAX_EVENTS)
            if not events and wait >= BUSY_WAIT_S:
                return
            self._serve(events)

    def _serve(self, events: list[tuple[int, int]]) -> None:
        """One pass: the ready sockets' handlers, the timers due, then what they deferred."""
        self._in_pass = True
        try:
            for fd, mask in events:
                handler = self._handlers.get(fd)
                if handler is not None:
                    self._call(fd, handler, mask)
            self._now = trio.current_time()
            self._run_timers(self._now)
        finally:
            self._in_pass = False
            self._run_later()

    def _run_later(self) -> None:
        while self._later:
            callbacks, self._later = self._later, []
            for callback in callbacks:
                try:
                    callback()
                except Exception:
                    log.exception("a deferred callback failed")

    def close(self) -> None:
        """Once ``run`` has ended (what is still registered then is only forgotten)."""
        self._epoll.close()

    def _call(self, fd: int, handler: Callable[[int], None], mask: int) -> None:
        self._now = trio.current_time()
        try:
            handler(mask)
        except Exception:
            log.exception("a socket's handler failed; the socket is dropped")
            self.unregister(fd)

    def _next_deadline(self) -> float:
        timers = self._timers
        while timers and timers[0][2].callback is None:
            heapq.heappop(timers)
            self._stale -= 1
        return timers[0][0] if timers else math.inf

    def _run_timers(self, now: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            timer = heapq.heappop(timers)[2]
            callback, timer.callback = timer.callback, None
            if callback is None:
                self._stale -= 1
            else:
                try:
                    callback()
                except Exception:
                    log.exception("a timer failed")
