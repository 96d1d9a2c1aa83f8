"""The worker's runner threads: how they start, what each one is, and when a step is long.

The runners take turns leading (``loop.Worker``): the leader reads the channel and runs the
short steps itself; the standby watches the leader's steps and takes the lead from one that
turns long (``Watch``), a guest computing or spinning, so that its neighbours run on.
"""

from __future__ import annotations

import _thread
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .guest import GuestRun

# The standby checks this often whether the leader is in a long step: one that has used half this
# much CPU (a guest computing) between two checks, or lasted ten times as long (blocked, or starved
# of CPU). Then it takes the lead: a spinning guest delays its neighbours by about twice this much.
TURN_CHECK_S: Final = 0.001
STARVED_S: Final = 10 * TURN_CHECK_S


class Threads:
    """Starts threads without waiting for each one to run, and waits once for all of them.

    ``threading.Thread.start`` waits for each new thread to run: a hand-off between two threads
    per thread, a large part of the start of a worker that hosts one execution. Confinement
    waits for them all (``wait``): each has made its own start-up system calls by then."""

    def __init__(self) -> None:
        self._running = threading.Condition(threading.Lock())
        self._started = 0
        self._run = 0

    def start(self, target: Callable[[], None]) -> None:
        self._started += 1
        _thread.start_new_thread(self._bootstrap, (target,))

    def _bootstrap(self, target: Callable[[], None]) -> None:
        with self._running:
            self._run += 1
            self._running.notify()
        target()

    def wait(self) -> None:
        with self._running:
            self._running.wait_for(lambda: self._run == self._started)


@dataclass(eq=False, slots=True)
class Runner:
    """One runner thread: what wakes it, its CPU clock, and when its current step began."""

    wake: threading.Lock  # held; released by whoever wakes the thread (see ``Worker._join``)
    clock: int
    # Whether the step's CPU counts (else only its wall-clock time), and when it began. A new tuple
    # for each step, so that the standby tells the steps apart; one attribute, read at once.
    step: tuple[bool, float] = (False, 0.0)
    current: tuple[int, GuestRun] | None = None  # the slot and guest of the step it runs (the log pump's)


def step_begins(runner: Runner, *, counting_cpu: bool = True) -> None:
    """(Leading.) A step of ``runner`` starts now: the standby measures a long one from here, by
    its wall-clock time only while not ``counting_cpu``.

    Its CPU clock is not read here: reading a thread's CPU clock is a system call (the vDSO
    serves only the wall clocks), one per step, which on a loaded machine is dear; the standby
    reads it at its checks instead (``Watch``)."""
    runner.step = (counting_cpu, time.monotonic())


@dataclass(slots=True)
class Watch:
    """(The standby's.) The leader's step it first saw at its last check, and the leader's CPU
    clock then: the CPU a step has used is counted from the standby's first sight of it."""

    step: tuple[bool, float] | None = None
    cpu: float = 0.0

    def long(self, runner: Runner, step: tuple[bool, float]) -> bool:
        """Whether ``runner``'s ``step`` has lasted ``STARVED_S``, or (if its CPU counts) used half
        of ``TURN_CHECK_S`` since this watch first saw it, a check or more ago."""
        counting, began = step
        if time.monotonic() - began >= STARVED_S:
            return True
        if not counting:
            return False
        cpu = time.clock_gettime(runner.clock)
        if step is not self.step:
            self.step, self.cpu = step, cpu
            return False
        return cpu - self.cpu >= TURN_CHECK_S / 2
