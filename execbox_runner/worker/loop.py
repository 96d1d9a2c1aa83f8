"""The worker process: hosts many guest executions at once for the daemon.

Guest JavaScript never runs in the daemon. A worker is forked by the zygote
with one end of a socketpair, starts its runner threads, confines itself
(``sandbox.py``: from then on the kernel refuses it files, sockets, new
processes and new threads) and says ``Ready``.

Every frame on the channel carries a slot number: one slot is one execution,
with its own QuickJS runtime, heap and memory limit. An execution parked on a
tool call holds no thread, only its runtime. When a message arrives for a
slot, the slot is handed to the runner threads, which run its steps in order
(one thread at a time per runtime). Short steps run one runner at a time, in
turn (see ``Worker._runner``: threads contending for the GIL cost more than
the steps); a long one, a guest computing or spinning, lets the others go on
without the turn, and runs in parallel with them, since QuickJS releases the
GIL while JavaScript runs. A guest spinning on the CPU holds one runner thread
and nothing else, so its neighbours resume on the others.

The main thread reads the channel. An ``Abort`` for a slot whose guest code is
running is also given to the interrupter thread, which pokes that runtime
(``native.py``) until the guest has unwound, so a spinning guest still hands
over its logs. The interrupter also stops every guest still running at its
wall-clock deadline, so the worker enforces ``timeoutMs`` itself as well as
the daemon. Workers run at a lower scheduling priority than the daemon: a
storm of spinning guests cannot delay a ``done`` or a ``cancel``.

Usage (by the zygote, which calls ``run``; standalone only in tests):
``python -m execbox_runner.worker.loop FD [--no-sandbox] [--threads N]
[--max-memory BYTES] [--max-timeout SECONDS] [--max-output BYTES]``
"""

from __future__ import annotations

import argparse
import collections
import heapq
import itertools
import math
import os
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from ..protocol import ipc
from . import sandbox
from .failure import BUDGET_MESSAGE
from .guest import STACK_BYTES, TIMEOUT_MESSAGE, GuestRun, Runtime, fresh_runtime
from .normalize import normalize

POKE_INTERVAL_S: Final = 0.001
POKE_ATTEMPTS: Final = 2000  # keep interrupting for up to ~2 s, until the abort is taken
# Threads share the GIL between engine calls; the default 5 ms switch interval would eat the abort grace.
SWITCH_INTERVAL_S: Final = 0.0002
# Added to the worker's nice value: guests yield the CPU to the daemon that answers hosts.
NICENESS: Final = 10
DEFAULT_THREADS: Final = 16
# A runner waiting for the turn checks at once, then this often, whether the runner holding it is
# in a long step: one that has used this much CPU (a guest computing), or lasted ten times as long
# (blocked, or starved of CPU). Then it goes on without the turn: a spinning guest delays its
# neighbours by about this much.
TURN_CHECK_S: Final = 0.001
_READ_BYTES: Final = 64 << 10  # at most this much from the channel at a time
NOT_STARTED: Final = ipc.Finished(False, None, "timeout", TIMEOUT_MESSAGE, [])
NOT_STARTED_EVICTED: Final = ipc.Finished(False, None, "memory_limit", BUDGET_MESSAGE, [])


@dataclass(eq=False, slots=True)
class Hosted:
    """One execution hosted by this worker: its guest and the messages it has yet to take."""

    slot: int
    arrived: float  # when its Run arrived: its deadline counts from then, not from a runner taking it
    guest: GuestRun | None = None
    # A list, not a deque: it holds a message or two, and an empty deque costs every parked execution 760 bytes.
    mailbox: list[ipc.ToWorker] = field(default_factory=list)
    scheduled: bool = False  # a runner thread owns this slot until its mailbox is empty
    aborting: bool = False


class Interrupter:
    """A thread that pokes guests until each has taken its abort (or ~2 s passed): those asked
    to abort, and those still running at their deadline."""

    def __init__(self) -> None:
        self._pending: dict[GuestRun, int] = {}
        # A heap of (deadline, sequence, guest): weak, so that an ended execution's runtime is freed
        # at once, and never by id(), which a later guest can reuse.
        self._deadlines: list[tuple[float, int, weakref.ref[GuestRun]]] = []
        self._sequence = itertools.count()
        self._wake = threading.Condition()
        threading.Thread(target=self._run, name="interrupter", daemon=True).start()

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


class Worker:
    def __init__(
        self, sock: socket.socket, limits: sandbox.Limits | None, *, threads: int = DEFAULT_THREADS, probe: bool = False
    ) -> None:
        self.sock = sock
        self.probe = probe  # test hook: report what the confined worker can do, then exit
        self.limits = limits  # None: not confined (tests of the worker loop itself)
        self.threads = threads
        self.hosted: dict[int, Hosted] = {}
        # Guards hosted, each slot's mailbox, scheduled and aborting, and ready, idle and standby.
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.ready: collections.deque[Hosted] = collections.deque()  # slots with work, oldest first
        self.idle: list[threading.Lock] = []  # a held lock per idle runner, released to wake it; newest last
        self.standby = 0  # runners waiting for the turn
        self.turn = threading.Lock()  # see ``_runner``
        # The turn holder's CPU clock, and its CPU and wall-clock time as its current step began.
        self.step: tuple[int, float, float] = (time.CLOCK_THREAD_CPUTIME_ID, 0.0, 0.0)
        self.spare: Runtime | None = None
        self.interrupter: Interrupter | None = None

    def serve(self, runtime: Runtime | None = None) -> None:
        """Host executions until the channel closes.

        ``runtime`` is the first execution's, when the zygote prepared it before forking.
        """
        normalize("0")  # load the parser before the first request
        # (fresh_runtime also compiles the bootstrap, while files can still be read.)
        self.spare = runtime or fresh_runtime()
        # Every thread starts before confinement: afterwards the kernel refuses new ones.
        self.interrupter = Interrupter()
        previous = threading.stack_size(STACK_BYTES)
        for index in range(self.threads):
            threading.Thread(target=self._runner, name=f"runner-{index}", daemon=True).start()
        threading.stack_size(previous)
        missing = sandbox.confine(self.sock.fileno(), self.limits) if self.limits is not None else ["all"]
        if self.probe:
            self.sock.sendall(ipc.frame(0, ipc.Probed(outcomes=sandbox.probe(), missing=missing)))
            return
        self.sock.sendall(ipc.frame(0, ipc.Ready()))
        self._read()

    def _read(self) -> None:
        """The main thread: hand each message to its slot until the channel closes.

        An Abort (or Evict) for a slot whose Run no runner has taken yet is answered here:
        nothing ran, nothing is to unwind, and the runners may all be busy with spinning
        guests. So is a Measure: the heaps are read without stopping any guest.
        """
        for slot, message in receive_frames(self.sock):
            if isinstance(message, ipc.Measure):
                self._send(0, ipc.Heaps(self._heaps()))
                continue
            poke = wake = None
            stopping = isinstance(message, ipc.Abort | ipc.Evict)
            with self.lock:
                hosted = self.hosted.get(slot)
                if isinstance(message, ipc.Run):
                    if hosted is not None:
                        continue  # the daemon never reuses a live slot: drop the duplicate
                    hosted = self.hosted[slot] = Hosted(slot, time.monotonic())
                elif hosted is None:
                    continue  # a late Settle/Abort/Evict for an execution that already finished
                unstarted = stopping and bool(hosted.mailbox) and isinstance(hosted.mailbox[0], ipc.Run)
                if unstarted:
                    del self.hosted[slot]  # a runner that takes the slot up later finds its mailbox empty
                    hosted.mailbox.clear()
                else:
                    if stopping:
                        hosted.aborting = True
                        poke = hosted.guest
                    hosted.mailbox.append(message)
                    if not hosted.scheduled:
                        hosted.scheduled = True
                        self.ready.append(hosted)
                        wake = self._runner_to_wake(0)
            if wake is not None:
                wake.release()
            if unstarted:
                self._send(slot, NOT_STARTED_EVICTED if isinstance(message, ipc.Evict) else NOT_STARTED)
            elif poke is not None and self.interrupter is not None:
                self.interrupter.request(poke)

    def _runner_to_wake(self, taking: int) -> threading.Lock | None:
        """(Under ``lock``.) With more slots ready than the caller is about to take and no
        runner standing by: the idle runner to wake (the newest), counted as standing by."""
        if len(self.ready) > taking and not self.standby and self.idle:
            self.standby += 1
            return self.idle.pop()
        return None

    def _runner(self) -> None:
        """Run ready slots: one runner at a time while their steps are short.

        Runners all at work hand the GIL over at each of an execution's engine
        calls, each time a thread switch, and each runner's caches go cold: with
        16 trivial executions in flight that was ~70 switches and twice the CPU
        per execution of one runner doing them in turn. So the runner holding
        the turn takes ready slots until none is left, while one other stands
        by for it; an idle runner is woken newest first, its caches the
        warmest. If the holder's step is long (a guest computing or spinning),
        the one standing by goes on without the turn and another stands by: a
        spinning guest still holds one runner and nothing else, and delays its
        neighbours by about ``TURN_CHECK_S``.
        """
        wake = threading.Lock()
        wake.acquire()
        clock = time.pthread_getcpuclockid(threading.get_ident())
        while True:
            with self.lock:
                idle = not self.ready
                if idle:
                    self.idle.append(wake)
                else:
                    self.standby += 1
            if idle:
                wake.acquire()  # whoever wakes this runner counts it as standing by
            turn = self._take_turn(clock)
            while True:
                with self.lock:
                    hosted = self.ready.popleft() if self.ready else None
                    other = self._runner_to_wake(0)
                if other is not None:
                    other.release()
                if hosted is None:
                    break
                self._run(hosted, clock if turn else None)
                if not turn:
                    break  # back to the turn, which the long step may have left
            if turn:
                self._prepare_spare(clock)
                self.turn.release()

    def _prepare_spare(self, clock: int) -> None:
        """(Holding the turn, nothing ready.) Make the next execution's runtime now, before its Run
        arrives: ~0.25 ms less between a host's ``execute`` and its guest running. A worker with one
        runner (``hardened``: retired after its one execution) makes none."""
        with self.lock:
            if self.spare is not None or self.ready or self.threads == 1:
                return
        self._step_begins(clock, counting_cpu=False)  # runs no guest code (see ``_take``)
        spare = fresh_runtime()
        with self.lock:
            if self.spare is None:
                self.spare = spare

    def _take_turn(self, clock: int) -> bool:
        """Stand by for the turn: True once taken; False, to go on without it, when its holder's
        step has used ``TURN_CHECK_S`` of CPU or lasted ten times as long."""
        try:
            wait = 0.0
            while not self.turn.acquire(timeout=wait):
                wait = TURN_CHECK_S
                holder, cpu, began = self.step
                try:
                    spent = time.clock_gettime(holder) - cpu
                except OSError:  # a stale reading, of a thread that has gone
                    continue
                if spent >= TURN_CHECK_S or time.monotonic() - began >= 10 * TURN_CHECK_S:
                    return False
            self._step_begins(clock)
            return True
        finally:
            with self.lock:
                self.standby -= 1
                other = self._runner_to_wake(1)
            if other is not None:
                other.release()

    def _run(self, hosted: Hosted, clock: int | None) -> None:
        """Drain one slot; ``clock``: this runner's CPU clock while it holds the turn."""
        try:
            self._drain(hosted, clock)
        except Exception as exc:  # a bug must cost one execution, not the worker's others
            self._end(hosted)
            self._send(hosted.slot, ipc.Finished(False, None, "internal_error", f"worker failure: {exc}", []))

    def _drain(self, hosted: Hosted, clock: int | None) -> None:
        """Take the slot's messages in order until none is left or the execution ends."""
        while True:
            with self.lock:
                if not hosted.mailbox:
                    hosted.scheduled = False
                    return
                message = hosted.mailbox.pop(0)
            out = self._take(hosted, message, clock)
            if isinstance(out, ipc.Finished):
                self._end(hosted)
                self._send(hosted.slot, out)
                return
            if out.calls or out.logs:
                self._send(hosted.slot, out)

    def _step_begins(self, clock: int, *, counting_cpu: bool = True) -> None:
        """(Holding the turn.) A step starts now: ``_take_turn`` measures a long one from here, by
        its wall-clock time only while not ``counting_cpu``."""
        self.step = (clock, time.clock_gettime(clock) if counting_cpu else math.inf, time.monotonic())

    def _take(self, hosted: Hosted, message: ipc.ToWorker, clock: int | None) -> ipc.ToolCalls | ipc.Finished:
        """One message of a slot, a step; ``clock`` as for ``_run``.

        A Run's CPU is counted from when its guest is made: making it (a runtime when no spare
        was prepared, the code normalized) is work of ~0.5 ms that runs no guest code. Counted
        in, it pushed steps past ``TURN_CHECK_S`` on a loaded worker, every runner went on without
        the turn and they contended for the GIL: twice the CPU per execution, and the backlog
        that caused it grew. A guest that takes long to make still lets the others go on by the
        step's wall-clock time.
        """
        if clock is not None:
            self._step_begins(clock, counting_cpu=not isinstance(message, ipc.Run))
        if isinstance(message, ipc.Run):
            with self.lock:  # the prepared runtime is for exactly one execution
                runtime, self.spare = self.spare, None
            guest = GuestRun(message, runtime, arrived=hosted.arrived)
            if clock is not None:
                self._step_begins(clock)
            with self.lock:
                hosted.guest = guest
                aborting = hosted.aborting
            if self.interrupter is not None:
                self.interrupter.watch(guest)
                if aborting:
                    self.interrupter.request(guest)
            return guest.start()
        running = hosted.guest
        assert running is not None  # Run is always a slot's first message
        if isinstance(message, ipc.Settle):
            return running.settle(message)
        if isinstance(message, ipc.Evict):
            return running.evict()
        return running.abort()

    def _heaps(self) -> list[tuple[int, int]]:
        """Each started execution's slot and the bytes its runtime holds now."""
        with self.lock:
            guests = [(slot, hosted.guest) for slot, hosted in self.hosted.items() if hosted.guest is not None]
        return [(slot, guest.memory.used) for slot, guest in guests]

    def _end(self, hosted: Hosted) -> None:
        with self.lock:
            self.hosted.pop(hosted.slot, None)
            hosted.mailbox.clear()
            hosted.scheduled = False
        if hosted.guest is not None and self.interrupter is not None:
            self.interrupter.forget(hosted.guest)

    def _send(self, slot: int, message: ipc.FromWorker) -> None:
        data = ipc.frame(slot, message)
        with self.send_lock:
            self.sock.sendall(data)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Blocking read of exactly ``n`` bytes (worker side); EOFError on a closed channel."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("channel closed")
        got += k
    return bytes(buf)


def receive_frames(sock: socket.socket) -> Iterator[tuple[int, ipc.ToWorker]]:
    """The daemon's frames, read as the kernel has them: one system call for as many frames as have
    arrived (under load, many), rather than two for each. EOFError once the channel closes."""
    frames = ipc.Unframer()
    while True:
        while (body := frames.next()) is None:
            data = sock.recv(_READ_BYTES)
            if not data:
                raise EOFError("channel closed")
            frames.feed(data)
        yield ipc.to_worker_decoder.decode(body)


def address_space(max_memory: int, max_output: int, threads: int) -> int:
    """The address-space backstop: what the process maps now, the runner stacks, room for
    the largest QuickJS heap and copies of the largest output, plus slack."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    return mapped + threads * STACK_BYTES + 2 * max_memory + 4 * max_output + (256 << 20)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="execbox_runner.worker.loop")
    parser.add_argument("fd", type=int)
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument("--max-memory", type=int, default=512 << 20, help="what the guest heaps may add up to")
    parser.add_argument("--max-timeout", type=float, default=300.0)
    parser.add_argument("--max-output", type=int, default=16 << 20)
    parser.add_argument("--cpu-seconds", type=int, default=3600, help="the process's CPU-time backstop (RLIMIT_CPU)")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    return parser


def run(fd: int, args: argparse.Namespace, runtime: Runtime | None = None) -> int:
    """Be a worker on channel ``fd`` until it closes; the process's exit status."""
    # The daemon owns signals; a Ctrl-C in the terminal must not kill workers first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    os.nice(NICENESS)
    with socket.socket(fileno=fd) as sock:
        limits = None
        if not args.no_sandbox:
            limits = sandbox.Limits(
                address_space_bytes=address_space(args.max_memory, args.max_output, args.threads),
                cpu_seconds=args.cpu_seconds,
            )
        try:
            Worker(sock, limits, threads=args.threads, probe=args.probe).serve(runtime)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass
    return 0


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv[1:])
    status = run(args.fd, args)
    # Skip interpreter teardown: there is nothing to flush, and it costs time.
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
