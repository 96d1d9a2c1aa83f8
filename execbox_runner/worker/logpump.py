"""The log pump: a worker's thread that sends the log lines of guests in a step while they run.

A guest writes its lines into its runtime's ring (``logring.py``); the pump reads the rings of
the guests in a step every ``PUMP_INTERVAL_S`` and sends what it finds, so the daemon has them
even if it ends the execution first, or the worker dies. It wakes only while a step runs: a step
that ends first reports its lines itself.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Final

from ..protocol import ipc
from .guest import GuestRun

# How often the log pump reads the rings of guests in a step: a line written reaches the daemon about
# this much later at most, on an idle machine (a step's last lines go with its report, at once).
PUMP_INTERVAL_S: Final = 0.002


class LogPump:
    """Which guests are in a step, and the thread that reads their rings meanwhile."""

    def __init__(
        self, send: Callable[[int, ipc.FromWorker], None], start: Callable[[Callable[[], None]], None]
    ) -> None:
        """``send`` sends a frame to the daemon; ``start`` starts the thread."""
        self._send = send
        self._stepping: dict[int, GuestRun] = {}  # slot -> its guest, while a runner runs a step of it
        self._wake = threading.Condition(threading.Lock())
        start(self._run)

    def stepping(self, slot: int, guest: GuestRun) -> None:
        with self._wake:
            self._stepping[slot] = guest
            if len(self._stepping) == 1:
                self._wake.notify()

    def stepped(self, slot: int) -> None:
        with self._wake:
            del self._stepping[slot]

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stepping:
                    self._wake.wait()
            time.sleep(PUMP_INTERVAL_S)
            with self._wake:
                stepping = list(self._stepping.items())
            for slot, guest in stepping:
                guest.stream(functools.partial(self._report, slot))

    def _report(self, slot: int, lines: list[str]) -> None:
        self._send(slot, ipc.ToolCalls(calls=[], logs=lines))
