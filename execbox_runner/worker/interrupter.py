"""The interrupter: a worker's thread that stops guests at their deadline, and when asked to.

A guest stops only at an interrupt check of its own code, so stopping it is a poke
(``GuestRun.interrupt``, ``native.poke``), repeated every ``POKE_INTERVAL_S`` until the guest
has taken its abort: an engine call that begins just after a poke re-arms its own limit. It keeps
the daemon's scheduling priority (see ``loop.py``): stopping a guest must not wait behind the
guests of a busy machine.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final

from .guest import GuestRun

POKE_INTERVAL_S: Final = 0.001
POKE_ATTEMPTS: Final = 2000  # keep interrupting for up to ~2 s, until the abort is taken


class Interrupter:
    """A thread that pokes guests until each has taken its abort (or ~2 s passed): those asked
    to abort, and those still running at their deadline."""

    def __init__(self, start: Callable[[Callable[[], None]], None] | None = None) -> None:
        """``start`` starts the thread (a new ``threading.Thread`` if None)."""
        self._pending: dict[GuestRun, int] = {}
        # A heap of (deadline, sequence, guest): weak, so that an ended execution's runtime is freed
        # at once, and never by id(), which a later guest can reuse.
        self._deadlines: list[tuple[float, int, weakref.ref[GuestRun]]] = []
        self._sequence = itertools.count()
        self._wake = threading.Condition()
        (start or _thread_of)(self._run)

    def request(self, guest: GuestRun) -> None:
        with self._wake:
            self._pending.setdefault(guest, POKE_ATTEMPTS)
            self._wake.notify()

    def watch(self, guest: GuestRun) -> None:
        """Stop ``guest`` at its deadline if it is still running then. The thread is woken only
        when this deadline comes first: it already sleeps until the earliest one (a wake-up per
        execution would cost a thread switch each)."""
        with self._wake:
            earliest = self._deadlines[0][0] if self._deadlines else math.inf
            heapq.heappush(self._deadlines, (guest.deadline, next(self._sequence), weakref.ref(guest)))
            if guest.deadline < earliest:
                self._wake.notify()

    def forget(self, guest: GuestRun) -> None:
        with self._wake:
            self._pending.pop(guest, None)

    def _due(self) -> float | None:
        """Move guests whose deadline passed to the pokes; seconds until the next deadline of a
        guest that has not finished.

        Finished guests are dropped on the way: the thread then sleeps until the deadline of the
        oldest execution still going, not until each finished one's (a wake-up per execution).
        """
        now = time.monotonic()
        while self._deadlines:
            deadline, _, ref = self._deadlines[0]
            guest = ref()
            if guest is not None and guest.finished is None:
                if deadline > now:
                    return deadline - now
                self._pending.setdefault(guest, POKE_ATTEMPTS)
            heapq.heappop(self._deadlines)
        return None

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending:
                    self._wake.wait(self._due())
                    self._due()
                pending = list(self._pending.items())
            done = [guest for guest, left in pending if left <= 0 or not guest.interrupt()]
            time.sleep(POKE_INTERVAL_S)
            with self._wake:
                for guest, _ in pending:
                    if guest in done or guest.abort_taken.is_set():
                        self._pending.pop(guest, None)
                    elif guest in self._pending:
                        self._pending[guest] -= 1


def _thread_of(target: Callable[[], None]) -> None:
    threading.Thread(target=target, daemon=True).start()
