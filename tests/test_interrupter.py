"""The worker's interrupter stops a guest at its own deadline, never at another's."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from execbox_runner.worker.guest import GuestRun
from execbox_runner.worker.interrupter import Interrupter


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


def test_finished_guests_leave_the_deadlines_as_the_thread_wakes() -> None:
    """Not one wake-up at each finished guest's deadline: the first wake-up drops them all."""
    interrupter = Interrupter()
    finished = [StandIn(time.monotonic() + 60 + index) for index in range(100)]
    for guest in finished:
        interrupter.watch(cast(GuestRun, guest))
        guest.finished = True
    due = StandIn(time.monotonic() + 0.05)
    interrupter.watch(cast(GuestRun, due))  # earlier than any: wakes the thread
    for _ in range(200):
        if due.pokes:
            break
        time.sleep(0.01)
    assert due.pokes == 1
    with interrupter._wake:
        assert interrupter._deadlines == []
