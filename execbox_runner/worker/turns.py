"""Turns: at most the worker's share of its guests compute at once, the others held, in rotation.

The daemon gives a tenant's workers its part of a machine shared with other tenants (``Share``,
``daemon/pool/sharing.py``): how many guests may compute at once. The kernel shares the CPU
between runnable threads alike, so without it a tenant's many spinning guests would take the CPU
of as many runner threads. A thread of this class looks at the guests in a step as they turn long
and as turns end: while more of them have been computing for ``LONG_S`` than the share allows, it
holds the surplus (``GuestRun.hold``: the guest waits at its next interrupt check, off the CPU)
and lets those held longest go in turns of ``QUANTUM_S``. Short steps are never held, so a
tenant's resumes and quick executions keep their latency beside its own spinning guests; a held
guest's deadline, abort and log lines work as ever (``interrupt`` lets it go first). A share of 0
holds nothing.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Final

from .guest import GuestRun

# How long a guest computes before the next one of its worker takes its turn.
QUANTUM_S: Final = 0.02
# A step this long (wall-clock time) is computing: it takes turns with the others.
LONG_S: Final = 0.002


class Turns:
    """Which guests are in a step, since when, and which of them are held.

    The thread sleeps while there is nothing to hold, and otherwise wakes exactly when a step
    turns long or a turn is up: a tenant's spinning guests are held as they turn long, not a
    quantum later, and a worker within its share is never polled."""

    def __init__(self, start: Callable[[Callable[[], None]], None]) -> None:
        """``start`` starts the thread (as for the worker's other threads)."""
        # Held through the lock itself where no wait is involved: a condition's own ``with`` is
        # Python code, and every step of every guest passes here twice.
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stepping: dict[GuestRun, float] = {}  # guest -> when its step began
        self._held: dict[GuestRun, float] = {}  # guest -> since when it waits for its turn
        self._turned: dict[GuestRun, float] = {}  # guest let go -> when its turn began
        self._share = 0
        self._look_at = math.inf  # when the thread looks next
        start(self._run)

    def share(self, steps: int) -> None:
        """At most ``steps`` guests compute at once from now (0: as many as run)."""
        with self._wake:
            self._share = max(steps, 0)
            self._look(time.monotonic())

    def stepping(self, guest: GuestRun) -> None:
        with self._lock:
            now = time.monotonic()
            self._stepping[guest] = now
            if self._share and len(self._stepping) > self._share:
                self._look(now + LONG_S)  # when this step may have turned long

    def stepped(self, guest: GuestRun) -> None:
        with self._lock:
            began = self._stepping.pop(guest)
            self._turned.pop(guest, None)
            if self._held.pop(guest, None) is not None:  # an engine call ended its hold
                guest.let_go()
            elif self._held and time.monotonic() - began >= LONG_S:
                self._look(time.monotonic())  # a turn is free: one held takes it

    def _look(self, when: float) -> None:
        if when < self._look_at:
            self._look_at = when
            self._wake.notify()

    def _run(self) -> None:
        with self._wake:
            while True:
                now = time.monotonic()
                if now >= self._look_at:
                    self._look_at = self._turn(now)
                self._wake.wait(None if self._look_at == math.inf else self._look_at - now)

    def _turn(self, now: float) -> float:
        """(Under the lock, so that no guest's step ends meanwhile.) Let ``share`` guests compute:
        those whose turn is not up, then those held longest; hold the rest (again: an engine call
        of theirs since then may have ended the hold). When to look next: when a turn is up while
        any is held, and when the next step turns long while there are more steps than the share."""
        computing, turning, keys = [], math.inf, {}
        for guest, began in self._stepping.items():
            if now - began >= LONG_S:
                computing.append(guest)
                turn = self._turned.get(guest, began)
                keys[guest] = self._held.get(guest, -math.inf if now - turn < QUANTUM_S else now)
            else:
                turning = min(turning, began + LONG_S)
        if not self._share or len(self._stepping) <= self._share:
            turning = math.inf
        if len(computing) <= self._share or not self._share:
            for guest in self._held:
                guest.let_go()
            self._held.clear()
            return turning
        computing.sort(key=keys.__getitem__)
        for guest in computing[: self._share]:
            if self._held.pop(guest, None) is not None:
                guest.let_go()
                self._turned[guest] = now
        for guest in computing[self._share :]:
            if guest.hold():
                self._held.setdefault(guest, now)
        return min(now + QUANTUM_S, turning)
