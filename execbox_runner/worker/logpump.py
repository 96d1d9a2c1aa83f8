"""The log pump: a worker's thread that sends the log lines of guests in a long step while they run.

A guest writes its lines into its runtime's ring (``logring.py``); the pump reads the rings of
the steps it watches every ``PUMP_INTERVAL_S`` and sends what it finds, so the daemon has them
even if it ends the execution first, or the worker dies. It watches the steps that run without
the lead: those the standby took the lead from, being long (a guest computing or spinning), and
those a runner without the lead began. A leader's step is short, or soon not the leader's: it
reports its lines itself as it ends, and the pump does not wake for it (a wake-up per step cost
the worker more than the step's own engine work). A watched step is forgotten at the pump's
first look after it ended.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import TYPE_CHECKING, Final, Protocol

from ..protocol import ipc

if TYPE_CHECKING:
    from collections.abc import Callable

    from .guest import GuestRun

# How often the log pump reads the rings of the steps it watches: a line written in one reaches the
# daemon about this much later at most, on an idle machine (a step's last lines go with its report).
PUMP_INTERVAL_S: Final = 0.002


class Stepping(Protocol):
    """A runner thread, as the pump sees it: the step it runs now (its slot and guest; a new
    tuple each step), None between steps."""

    current: tuple[int, GuestRun] | None


class LogPump:
    """The steps watched, and the thread that reads their rings meanwhile."""

    def __init__(
        self, send: Callable[[int, ipc.FromWorker], None], start: Callable[[Callable[[], None]], None]
    ) -> None:
        """``send`` sends a frame to the daemon; ``start`` starts the thread."""
        self._send = send
        self._watched: dict[Stepping, tuple[int, GuestRun]] = {}  # runner -> the step of it watched
        self._wake = threading.Condition(threading.Lock())
        start(self._run)

    def watch(self, runner: Stepping) -> None:
        """Read the rings of ``runner``'s current step (if it still runs one) until it ends."""
        step = runner.current
        if step is None:
            return
        with self._wake:
            self._watched[runner] = step
            if len(self._watched) == 1:
                self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._watched:
                    self._wake.wait()
            time.sleep(PUMP_INTERVAL_S)
            with self._wake:
                for runner, step in list(self._watched.items()):
                    if runner.current is not step:  # that step has ended
                        del self._watched[runner]
                watched = list(self._watched.values())
            for slot, guest in watched:
                guest.stream(functools.partial(self._report, slot))

    def _report(self, slot: int, lines: list[str]) -> None:
        self._send(slot, ipc.ToolCalls(calls=[], logs=lines))
