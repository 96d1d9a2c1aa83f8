"""The worker process: hosts many guest executions at once for the daemon.

Guest JavaScript never runs in the daemon. A worker is forked by the zygote
with one end of a socketpair, starts its runner threads, confines itself
(``sandbox.py``: from then on the kernel refuses it files, sockets, new
processes and new threads) and says ``Ready``.

Every frame on the channel carries a slot number: one slot is one execution,
with its own QuickJS runtime, heap and memory limit. An execution parked on a
tool call holds no thread, only its runtime. Its messages are run in order, as
steps, by one runner thread at a time.

The runner threads take turns leading (see ``Worker._runner``): the leader
reads the channel and runs the short steps itself, one after another, so a
trivial execution costs no hand-off between threads (threads handing work and
the GIL to each other cost more than the steps), and while more steps are ready their reports
wait to leave in one write. Another runner stands by and
watches the leader's steps; when one turns long, a guest computing or
spinning, the standby takes the lead and the old leader goes on with its step
in parallel, since QuickJS releases the GIL while JavaScript runs. A guest
spinning on the CPU holds one runner thread and nothing else, so its
neighbours resume on the others. There is one runner more than may run steps
at once: with all the others busy with spinning guests, the last one still
reads the channel.

An ``Abort`` for a slot whose guest code is running is also given to the
interrupter thread (``interrupter.py``), which pokes that runtime until the guest
has unwound; it also stops every guest still running at its wall-clock deadline,
so the worker enforces ``timeoutMs`` itself as well as the daemon. A guest's log
lines leave the worker as they are written: sent by the log pump thread
(``logpump.py``) while its step is long, and with the step's report as it ends.
In the standard profile a prefault thread (``prefault.py``) faults in the heap's
new pages as it grows, so that a burst of executions does not pay for them a
page fault at a time.
Workers run at a lower scheduling priority than the daemon: a storm of spinning
guests cannot delay a ``done`` or a ``cancel``. The interrupter and the log pump
keep the daemon's: they do little, and what they do (stop a guest at its
deadline, hand its lines over) must not wait behind the guests of a busy
machine. So does the turns thread (``turns.py``), which holds the guests computing
beyond the worker's share of a machine shared between tenants, in rotation. The
main thread only waits for the channel to close.

Usage (by the zygote, which calls ``run``; standalone only in tests):
``python -m execbox_runner.worker.loop FD [--no-sandbox] [--threads N]
[--max-memory BYTES] [--max-timeout SECONDS] [--max-output BYTES]``
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from ..protocol import ipc
from . import native, sandbox
from .alarm import Alarm
from .failure import BUDGET_MESSAGE
from .guest import TIMEOUT_MESSAGE, GuestRun
from .interrupter import Interrupter
from .logpump import LogPump
from .normalize import normalize
from .prefault import Prefaulter
from .runners import TURN_CHECK_S, Runner, Threads, Watch, step_begins
from .runtime import STACK_BYTES, Runtime, fresh_runtime
from .turns import Turns

# Threads share the GIL between engine calls; the default 5 ms switch interval would eat the abort grace.
SWITCH_INTERVAL_S: Final = 0.0002
# Added to the worker's nice value: guests yield the CPU to the daemon that answers hosts.
NICENESS: Final = 10
DEFAULT_THREADS: Final = 16
_READ_BYTES: Final = 64 << 10  # at most this much from the channel at a time
# While more steps are ready, the leader's reports wait for others to go with them, the first at most
# this long and one step more (see ``Worker._lead``).
HOLD_S: Final = 0.0002
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


class Worker:
    def __init__(
        self, sock: socket.socket, limits: sandbox.Limits | None, *, threads: int = DEFAULT_THREADS, probe: bool = False
    ) -> None:
        self.sock = sock
        self.probe = probe  # test hook: report what the confined worker can do, then exit
        self.limits = limits  # None: not confined (tests of the worker loop itself)
        self.threads = threads  # at most this many runners run steps at once; one more reads
        self.hosted: dict[int, Hosted] = {}
        self.frames = ipc.Unframer()  # the channel's bytes, read by the leader only
        # Guards hosted, each slot's mailbox, scheduled and aborting, and the roles below.
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.held: list[bytes] = []  # the leader's reports not sent yet (under send_lock)
        self.held_since = 0.0  # when the first of them was held
        self.ready: collections.deque[Hosted] = collections.deque()  # slots with work, oldest first
        self.leader: Runner | None = None  # reads the channel and runs short steps (see ``_lead``)
        self.stepping = False  # the leader is running steps, away from the channel
        self.batches = 0  # how often the leader has left the channel for steps
        self.standby: Runner | None = None  # watches the leader's steps (see ``_stand_by``)
        self.asleep = False  # the standby sleeps until the alarm rings (see ``_stand_by``)
        self.armed = False  # the alarm is set and the standby has not woken from it
        self.alarm = Alarm(TURN_CHECK_S)  # made here: confined, the worker could not make it
        self.idle: list[Runner] = []  # newest last
        self.running = 0  # runners running steps without the lead
        self.spare: Runtime | None = None
        self.prefaulter: Prefaulter | None = None
        self.interrupter: Interrupter | None = None
        self.pump: LogPump | None = None
        self.turns: Turns | None = None
        self.local = threading.local()  # each runner thread's ``Runner`` (its ``runner``)
        self.confined = threading.Event()  # set once the runners may start
        self.ended = threading.Lock()  # released when a runner ends on the channel's failure
        self.failure: BaseException | None = None

    def serve(self, runtime: Runtime | None = None) -> None:
        """Host executions until the channel closes (its error is raised here).

        ``runtime`` is the first execution's, when the zygote prepared it before forking.
        """
        try:
            missing = self._start(runtime)
        except Exception as exc:  # its stderr may be closed already: the daemon logs why
            self.sock.sendall(ipc.frame(0, ipc.StartFailed(f"{type(exc).__name__}: {exc}")))
            raise
        if self.probe:
            self.sock.sendall(ipc.frame(0, ipc.Probed(outcomes=sandbox.probe(), missing=missing)))
            return
        self.confined.set()
        self.sock.sendall(ipc.frame(0, ipc.Ready()))
        self.ended.acquire()
        assert self.failure is not None
        raise self.failure

    def _start(self, runtime: Runtime | None) -> list[str]:
        """Everything before Ready: the runner threads, then confinement; what could not be applied."""
        if runtime is None:  # else the zygote loaded the parser and compiled the bootstrap
            normalize("0")  # load the parser before the first request
            # (fresh_runtime also compiles the bootstrap, while files can still be read.)
            runtime = fresh_runtime()
        self.spare = runtime
        # Every thread starts before confinement: afterwards the kernel refuses new ones.
        threads = Threads()
        self.interrupter = Interrupter(threads.start)
        self.pump = LogPump(self._send, threads.start)
        if self.threads > 1 and native.HOLDS:  # a tenant's share of a machine (``Share``)
            self.turns = Turns(threads.start)
        os.nice(NICENESS)  # a thread's own: this one's, and those it starts from here on
        if self.threads > 1:  # hardened: one execution per process, its heap never grows much
            self.prefaulter = Prefaulter()
        self.ended.acquire()
        previous = threading.stack_size(STACK_BYTES)
        for _ in range(self.threads + 1):
            threads.start(self._runner)
        threading.stack_size(previous)
        threads.wait()
        keep = (self.sock.fileno(), self.alarm.fd)
        return sandbox.confine(keep, self.limits) if self.limits is not None else ["all"]

    def _runner(self) -> None:
        """A runner thread: in turn the leader, on a long step a runner without the lead, then the
        standby or idle until it leads again.

        The threads are all alike, with the stack guest code needs, and one more than may run
        steps at once: with every other runner busy with a spinning guest, the last one still
        reads the channel, where an Abort for a spinner arrives.
        """
        me = self.local.runner = Runner(threading.Lock(), time.pthread_getcpuclockid(threading.get_ident()))
        me.wake.acquire()
        try:
            self.confined.wait()  # no guest code runs before the process is confined
            self._join(me, led=False)
            while True:
                self._lead(me)
                self._join(me, led=True)
        except BaseException as exc:  # the channel failed (or closed): the worker ends
            with self.lock:
                first, self.failure = self.failure is None, self.failure or exc
            if first:
                self.ended.release()

    def _join(self, me: Runner, led: bool) -> None:
        """Return once ``me`` leads: at once if nobody does, else after standing by or idling.

        ``led``: ``me`` is back from a long step that it began as the leader. It first runs the
        slots left waiting while the leader reads: every other runner was busy when they came.
        """
        while True:
            with self.lock:
                hosted = self.ready.popleft() if led and self.ready and not self.stepping else None
                if hosted is None:
                    self.running -= led
                    if self.leader is None:
                        self.leader = me
                        return
                    standing = self.standby is None
                    if standing:
                        self.standby = me
                    else:
                        self.idle.append(me)
            if hosted is not None:
                self._run(hosted, None)
                continue
            if not standing:
                me.wake.acquire()  # whoever wakes an idle runner makes it the standby
            self._stand_by(me)
            return

    def _lead(self, me: Runner) -> None:
        """(Leading.) Read the channel and run the ready slots' steps, until the standby takes the
        lead during a long step of this runner (counted as running by the standby).

        One thread does it all while steps are short: a trivial execution costs no hand-off
        between threads, and with 16 runners all at work (each handing the GIL over at each of
        an execution's engine calls, their caches cold) it cost twice the CPU. Between steps
        the channel is read without waiting, so an Abort is taken after at most one step, and
        the lead moves only during a step, never while the channel is being read.

        While more steps are ready, the reports of its steps are held to go out together: a write
        per report, and the daemon's wake-up for each, cost more than the step itself did with
        ten tool calls at 64 executions at once. They go out once nothing is ready (before a
        spare runtime is made, or the channel waited on), once the first has waited ``HOLD_S``,
        or with any report another thread sends. Held before a step that turned long, they are
        the next leader's: it sends them after its first step at most.
        """
        fresh = True  # the channel has been read since the last step
        while True:
            arm = False
            with self.lock:
                if self.leader is not me:
                    return
                runnable = bool(self.ready) and self.running < self.threads
                hosted = self.ready.popleft() if runnable and fresh else None
                if hosted is not None:
                    me.step = (False, time.monotonic())  # before the standby can see it stepping
                    if not self.stepping:
                        self.batches += 1
                        arm = self.asleep and not self.armed
                        self.armed |= arm
                self.stepping = hosted is not None  # never while reading: the lead moves only in a step
            if arm:
                self.alarm.set()
            if hosted is not None:
                self._run(hosted, me)
                fresh = False
                continue
            if self.held and (not runnable or time.monotonic() - self.held_since >= HOLD_S):
                self._flush()
            if runnable or not self._prepare_spare():
                if not runnable and self.armed:  # going idle: the standby sleeps on
                    self._disarm()
                self._read(block=not runnable)
                fresh = True

    def _disarm(self) -> None:
        """(Leading.) Take back the alarm set as stepping began, unless it has woken the standby."""
        with self.lock:
            disarm, self.armed = self.armed, False
        if disarm:
            self.alarm.disarm()

    def _read(self, *, block: bool) -> None:
        """(Leading.) Dispatch what has arrived; with ``block``, wait until something does. One
        system call for as many frames as have arrived (under load, many)."""
        try:
            data = self.sock.recv(_READ_BYTES, 0 if block else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        if not data:
            raise EOFError("channel closed")
        self.frames.feed(data)
        while (body := self.frames.next()) is not None:
            self._dispatch(*ipc.to_worker_decoder.decode(body))

    def _dispatch(self, slot: int, message: ipc.ToWorker) -> None:
        """(Leading.) Hand one message to its slot.

        An Abort (or Evict) for a slot whose Run no runner has taken yet is answered here:
        nothing ran, nothing is to unwind, and the runners may all be busy with spinning
        guests. So is a Measure: the heaps are read without stopping any guest, and a Share.
        """
        if isinstance(message, ipc.Measure):
            self._send(0, ipc.Heaps(self._heaps()))
            return
        if isinstance(message, ipc.Share):
            if self.turns is not None:
                self.turns.share(message.steps)
            return
        poke = None
        stopping = isinstance(message, ipc.Abort | ipc.Evict)
        with self.lock:
            hosted = self.hosted.get(slot)
            if isinstance(message, ipc.Run):
                if hosted is not None:
                    return  # the daemon never reuses a live slot: drop the duplicate
                hosted = self.hosted[slot] = Hosted(slot, time.monotonic())
            elif hosted is None:
                return  # a late Settle/Abort/Evict for an execution that already finished
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
        if unstarted:
            self._send(slot, NOT_STARTED_EVICTED if isinstance(message, ipc.Evict) else NOT_STARTED)
        elif poke is not None and self.interrupter is not None:
            self.interrupter.request(poke)

    def _stand_by(self, me: Runner) -> None:
        """(The standby.) Return once ``me`` has taken the lead from a leader whose step is long
        (``runners.Watch``). Checks at once, then every ``TURN_CHECK_S`` while the leader runs steps;
        after a check that found it idle since the one before, sleeps until the alarm the leader
        sets as it steps again rings, ``TURN_CHECK_S`` later (``alarm.py``): a leader back on the
        channel by then disarms it, and its short steps cost no wake-up.

        The checks take no lock (the leader holds it often): only the standby moves the lead, so
        ``leader`` stays, and what a check reads of it is confirmed under the lock before
        taking over."""
        leader = self.leader
        assert leader is not None  # the first runner to start leads
        seen = -1
        watch = Watch()
        while True:
            batches = self.batches
            if self.stepping:
                step = leader.step
                if watch.long(leader, step) and self._take_lead(me, leader, step):
                    return
            elif batches == seen:
                with self.lock:
                    self.asleep = not self.stepping and self.batches == seen
                if self.asleep:
                    self.alarm.wait()
                    with self.lock:
                        self.asleep = self.armed = False
                    continue
            seen = batches
            time.sleep(TURN_CHECK_S)

    def _take_lead(self, me: Runner, leader: Runner, step: tuple[bool, float]) -> bool:
        """(The standby.) Take the lead if ``leader`` is still in ``step``; another runner stands by."""
        with self.lock:
            if not self.stepping or leader.step is not step:
                return False
            self.running += 1  # its step goes on, without the lead
            self.leader, self.stepping = me, False
            self.standby = self.idle.pop() if self.idle else None
            waking = self.standby
        if waking is not None:
            waking.wake.release()
        if self.pump is not None:  # the old leader's step is long: its lines go out as they are written
            self.pump.watch(leader)  # (the lead moved first: a step it finds has begun watches itself)
        return True

    def _prepare_spare(self) -> bool:
        """(Leading, nothing ready.) Make the next execution's runtime now, before its Run
        arrives: ~0.25 ms less between a host's ``execute`` and its guest running. A worker with
        one runner (``hardened``: retired after its one execution) makes none. False: none made."""
        with self.lock:
            if self.spare is not None or self.threads == 1:
                return False
        spare = fresh_runtime()  # runs no guest code: not a step
        with self.lock:
            if self.spare is None:
                self.spare = spare
        return True

    def _run(self, hosted: Hosted, me: Runner | None) -> None:
        """Drain one slot; ``me``: this runner while it leads."""
        try:
            self._drain(hosted, me)
        except Exception as exc:  # a bug must cost one execution, not the worker's others
            self._end(hosted)
            logs = hosted.guest.last_logs() if hosted.guest is not None else []
            self._send(hosted.slot, ipc.Finished(False, None, "internal_error", f"worker failure: {exc}", logs))

    def _drain(self, hosted: Hosted, me: Runner | None) -> None:
        """Take the slot's messages in order until none is left or the execution ends.

        The mailbox is taken whole, each time: messages arrive while a long drain runs (100,000
        tool results, read by the next leader), and taking them one by one from the front of a
        list that long cost time growing with the square of their number."""
        while True:
            with self.lock:
                messages, hosted.mailbox = hosted.mailbox, []
                if not messages:
                    hosted.scheduled = False
                    return
            for message in _batched(messages):
                out = self._take(hosted, message, me)
                if isinstance(out, ipc.Finished):
                    self._end(hosted)
                    self._send(hosted.slot, out, hold=me is not None)
                    return
                if out.calls or out.logs:
                    self._send(hosted.slot, out, hold=me is not None)

    def _take(
        self, hosted: Hosted, message: ipc.ToWorker | list[ipc.Settle], me: Runner | None
    ) -> ipc.ToolCalls | ipc.Finished:
        """One message of a slot (or the tool results that arrived together), a step; ``me`` as for
        ``_run``.

        A Run's CPU is counted from when its guest is made: making it (a runtime when no spare
        was prepared) is work that runs no guest code; normalizing its code is its first step's. Counted
        in, it pushed steps past ``TURN_CHECK_S`` on a loaded worker, the lead passed at every
        step and the runners contended for the GIL: twice the CPU per execution, and the backlog
        that caused it grew. A guest that takes long to make still passes the lead by the step's
        wall-clock time.
        """
        if me is not None:
            step_begins(me, counting_cpu=not isinstance(message, ipc.Run))
        if isinstance(message, ipc.Run):
            with self.lock:  # the prepared runtime is for exactly one execution
                runtime, self.spare = self.spare, None
            guest = GuestRun(message, runtime, arrived=hosted.arrived, streamed=self.pump is not None)
            if self.prefaulter is not None:
                self.prefaulter.check()
            if me is not None:
                step_begins(me)
            with self.lock:
                hosted.guest = guest
                aborting = hosted.aborting
            if self.interrupter is not None:
                self.interrupter.watch(guest)
                if aborting:
                    self.interrupter.request(guest)
            return self._step(hosted.slot, guest, guest.start)
        running = hosted.guest
        assert running is not None  # Run is always a slot's first message
        if isinstance(message, list):  # tool results that arrived together: one step
            return self._step(hosted.slot, running, lambda: running.settle(*message))
        if isinstance(message, ipc.Evict):
            return running.evict()
        return self._step(hosted.slot, running, running.abort)

    def _step(
        self, slot: int, guest: GuestRun, step: Callable[[], ipc.ToolCalls | ipc.Finished]
    ) -> ipc.ToolCalls | ipc.Finished:
        """Run guest code, its log lines streamed meanwhile, taking turns with the others."""
        if self.pump is None:
            return step()
        runner: Runner = self.local.runner
        runner.current = (slot, guest)  # before it looks at the lead: see ``_take_lead``
        if runner is not self.leader:  # no standby watches this step: the pump does, from the start
            self.pump.watch(runner)
        if self.turns is not None:
            self.turns.stepping(guest)
        try:
            return step()
        finally:
            if self.turns is not None:
                self.turns.stepped(guest)
            runner.current = None

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

    def _send(self, slot: int, message: ipc.FromWorker, *, hold: bool = False) -> None:
        """Send one frame, after the held ones; ``hold``: hold it instead if this runner still leads
        (see ``_lead``). Whether it does is asked once the frame is made, a large one taking a while:
        if the lead moved meanwhile, the new leader may have looked for held frames already, so
        this runner sends them itself."""
        data = ipc.frame(slot, message)
        with self.send_lock:
            if not self.held:
                self.held_since = time.monotonic()
            self.held.append(data)
            if hold and self.leader is self.local.runner:
                return
            self._write_held()

    def _flush(self) -> None:
        """Send the held frames."""
        with self.send_lock:
            self._write_held()

    def _write_held(self) -> None:
        """(Under send_lock.) The held frames, in one write."""
        if self.held:
            data = b"".join(self.held)
            self.held.clear()
            self.sock.sendall(data)


def _batched(messages: list[ipc.ToWorker]) -> list[ipc.ToWorker | list[ipc.Settle]]:
    """``messages`` in order, each run of Settles gathered into one list: taken in one step."""
    out: list[ipc.ToWorker | list[ipc.Settle]] = []
    for message in messages:
        if not isinstance(message, ipc.Settle):
            out.append(message)
        elif out and isinstance(out[-1], list):
            out[-1].append(message)
        else:
            out.append([message])
    return out


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


def mapped_bytes() -> int:
    """What this process maps now."""
    fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return int(os.read(fd, 4096).split()[0]) * os.sysconf("SC_PAGE_SIZE")
    finally:
        os.close(fd)


def address_space(max_memory: int, max_output: int, threads: int, mapped: int | None = None) -> int:
    """The address-space backstop: what the process maps now (``mapped``, when the zygote read it
    just before forking this process, which has mapped nothing since), the runner stacks, room for
    the largest QuickJS heap and copies of the largest output, plus slack."""
    if mapped is None:
        mapped = mapped_bytes()
    return mapped + (threads + 1) * STACK_BYTES + 2 * max_memory + 4 * max_output + (256 << 20)


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


def run(fd: int, args: argparse.Namespace, runtime: Runtime | None = None, mapped: int | None = None) -> int:
    """Be a worker on channel ``fd`` until it closes; the process's exit status. ``runtime`` and
    ``mapped`` (what the process maps): made or read by the zygote just before it forked this one."""
    # The daemon owns signals; a Ctrl-C in the terminal must not kill workers first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    with socket.socket(fileno=fd) as sock:
        limits = None
        if not args.no_sandbox:
            limits = sandbox.Limits(
                address_space_bytes=address_space(args.max_memory, args.max_output, args.threads, mapped),
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
