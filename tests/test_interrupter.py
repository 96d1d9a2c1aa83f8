"""The worker's interrupter stops a guest at its own deadline, never at another's."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from execbox_runner.worker.guest import GuestRun
from execbox_runner.worker.loop import Interrupter


class StandIn:
    """What the interrupter uses of a GuestRun: a deadline, whether it finished, a way to poke it."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.finished: Any = None
        self.abort_taken = threading.Event()
        self.pokes = 0

    def interrupt(self) -> bool:
        self.pokes += 1
        self.abort_taken.set()  # taken at once: one poke is enough
        return True


def test_a_guest_is_stopped_at_its_deadline() -> None:
    interrupter = Interrupter()
    guest = StandIn(time.monotonic() + 0.05)
    interrupter.watch(cast(GuestRun, guest))
    for _ in range(200):
        if guest.pokes:
            break
        time.sleep(0.01)
    assert guest.pokes == 1


def test_an_ended_guest_deadline_never_reaches_a_later_guest() -> None:
    """A later guest may get the id() of one that ended; the ended one's deadline must not poke it."""
    interrupter = Interrupter()
    later: list[StandIn] = []
    for _ in range(50):
        ended = StandIn(time.monotonic() + 0.05)
        interrupter.watch(cast(GuestRun, ended))
        interrupter.forget(cast(GuestRun, ended))
        del ended
        guest = StandIn(time.monotonic() + 60)  # often reuses the freed object's id
        interrupter.watch(cast(GuestRun, guest))
        later.append(guest)
    time.sleep(0.3)  # every ended guest's deadline has passed
    assert [guest.pokes for guest in later] == [0] * len(later)
