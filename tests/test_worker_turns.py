"""Runners take turns leading (``loop.Worker._runner``): the leader reads the channel and runs short
steps while another stands by, which takes the lead when a step turns long."""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, SupportsIndex

import pytest

from execbox_runner.protocol import ipc
from execbox_runner.worker import guest, loop, runners
from execbox_runner.worker.guest import TIMEOUT_MESSAGE, GuestRun
from execbox_runner.worker.loop import Hosted, Worker, _batched
from execbox_runner.worker.runners import TURN_CHECK_S, Runner
from execbox_runner.worker.runtime import Runtime
from execbox_runner.worker.turns import LONG_S, QUANTUM_S, Turns

from .guestkit import run_message
from .test_sandbox import next_message, receive, receive_any, start_worker

SPINNING = "console.log('spinning'); while (true) {}"


def spinning(sock: socket.socket, *slots: int) -> None:
    """Wait for the line each of ``slots`` streams (``SPINNING``'s): a line goes out while its
    guest runs only once its step is long, so each guest is computing, and holds no lead."""
    waiting = set(slots)
    while waiting:
        slot, message = next_message(sock)
        assert slot in waiting and message == ipc.ToolCalls(calls=[], logs=["spinning"]), (slot, message)
        waiting.discard(slot)


def test_a_guest_spinning_with_the_turn_holds_up_no_neighbour() -> None:
    process, sock = start_worker("--max-memory", str(64 << 20), "--threads", "2")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        sock.sendall(ipc.frame(1, run_message(SPINNING, budget=30)))
        spinning(sock, 1)
        sock.sendall(ipc.frame(2, run_message("6 * 7")))
        # Next, before the spinner's end (its 30 s budget): held up by it, the run would come after.
        assert receive(sock, 2) == ipc.Finished(True, b"42", None, "", [])
        sock.sendall(ipc.frame(1, ipc.Abort()))
        assert receive(sock, 1) == ipc.Finished(False, None, "timeout", TIMEOUT_MESSAGE, [])  # its line went out
    process.wait(timeout=30)


def test_with_every_runner_spinning_an_abort_is_read_and_a_waiting_run_goes_on_after() -> None:
    # The runner threads are one more than --threads: the last one reads the channel.
    process, sock = start_worker("--max-memory", str(64 << 20), "--threads", "2")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        sock.sendall(ipc.frame(1, run_message("console.log('one'); while (true) {}", budget=30)))
        sock.sendall(ipc.frame(2, run_message("while (true) {}", budget=30)))
        time.sleep(0.1)  # both runners took a spinning guest
        sock.sendall(ipc.frame(3, run_message("6 * 7", budget=30)) + ipc.frame(1, ipc.Abort()))
        finished = dict(receive_any(sock) for _ in range(2))
        assert finished[1] == ipc.Finished(False, None, "timeout", TIMEOUT_MESSAGE, ["one"])
        assert finished[3] == ipc.Finished(True, b"42", None, "", [])
        sock.sendall(ipc.frame(2, ipc.Abort()))
        assert receive(sock, 2) == ipc.Finished(False, None, "timeout", TIMEOUT_MESSAGE, [])
    process.wait(timeout=30)


def test_runs_sent_at_once_all_finish_beside_a_spinning_guest() -> None:
    count = 300
    process, sock = start_worker("--max-memory", str(256 << 20))
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        frames = [ipc.frame(1, run_message("while (true) {}", budget=2))]
        frames += [ipc.frame(slot, run_message(f"{slot} * 2", budget=30)) for slot in range(2, count + 2)]
        sock.sendall(b"".join(frames))
        results: dict[int, bytes | None] = {}
        for _ in range(count):
            slot, message = receive_any(sock)
            assert isinstance(message, ipc.Finished) and message.ok, message
            results[slot] = message.result
        assert results == {slot: str(slot * 2).encode() for slot in range(2, count + 2)}
        assert receive(sock, 1).code == "timeout"  # type: ignore[union-attr]
    process.wait(timeout=30)


def _served(
    threads: int, before: Callable[[Worker], None] = lambda worker: None
) -> tuple[Worker, socket.socket, threading.Thread]:
    """A worker serving in this process; ``before`` sees it before its runner threads start."""
    ours, theirs = socket.socketpair()
    worker = Worker(theirs, None, threads=threads)
    before(worker)

    def serve() -> None:
        with contextlib.suppress(EOFError):  # the test closed the channel: the worker's end
            worker.serve()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert isinstance(receive(ours), ipc.Ready)
    return worker, ours, thread


def test_short_steps_run_on_the_thread_that_reads_the_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    """No hand-off per message: while no step is long, the leader reads every message and runs every step."""
    monkeypatch.setattr(runners.Watch, "long", lambda self, runner, step: False)
    threads: list[int] = []

    def record(worker: Worker) -> None:
        dispatch, take = worker._dispatch, worker._take

        def dispatched(*args: Any) -> None:
            threads.append(threading.get_ident())
            dispatch(*args)

        def taken(*args: Any) -> ipc.ToolCalls | ipc.Finished:
            threads.append(threading.get_ident())
            return take(*args)

        worker._dispatch = dispatched  # type: ignore[method-assign]
        worker._take = taken  # type: ignore[method-assign]

    _, sock, thread = _served(4, record)
    with sock:
        for slot in range(1, 11):
            sock.sendall(ipc.frame(slot, run_message(f"{slot} * 2")))
            assert receive(sock, slot) == ipc.Finished(True, str(slot * 2).encode(), None, "", [])
    thread.join(timeout=5)
    assert len(threads) == 20 and len(set(threads)) == 1


def _spare(worker: Worker) -> Runtime | None:
    return worker.spare


def _spare_after_one_execution(threads: int, wait: float) -> Runtime | None:
    worker, sock, thread = _served(threads)
    with sock:
        assert _spare(worker) is not None  # the first execution's, made before Ready
        sock.sendall(ipc.frame(1, run_message("6 * 7")))
        finished = receive(sock, 1)
        assert isinstance(finished, ipc.Finished) and finished.result == b"42"
        deadline = time.monotonic() + wait
        while _spare(worker) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        spare = _spare(worker)
    thread.join(timeout=5)
    return spare


def test_a_worker_makes_the_next_runtime_once_nothing_is_ready() -> None:
    spare = _spare_after_one_execution(threads=2, wait=30)
    assert spare is not None and spare.context.eval("typeof console.log") == "function"


def test_a_worker_with_one_runner_makes_no_spare() -> None:
    # A spare takes well under 0.5 s to make (~0.3 ms; the other test waits for one up to 30 s).
    assert _spare_after_one_execution(threads=1, wait=0.5) is None


class _SlowToMake(GuestRun):
    """A guest whose making (runtime, normalized code) takes four times ``TURN_CHECK_S`` of CPU:
    counted, the standby's checks would find it long."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        end = time.thread_time() + 4 * TURN_CHECK_S
        while time.thread_time() < end:
            pass
        super().__init__(*args, **kwargs)


def test_making_a_guest_never_counts_as_a_long_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # A loaded worker once counted it: every runner went on without the turn, and contended for the GIL.
    monkeypatch.setattr(loop, "GuestRun", _SlowToMake)
    # By the wall clock a step is long on a loaded machine whatever it runs: its CPU is under test.
    monkeypatch.setattr(runners, "STARVED_S", math.inf)
    # The heap-trim count is the process's: runtimes freed by earlier tests could make one of these
    # steps trim the heap, a step long by the wall clock that passes the lead as it should.
    monkeypatch.setattr(guest, "_shrinking", guest._Shrinking())
    taken: list[bool] = []

    def count(worker: Worker) -> None:
        stand_by = worker._stand_by

        def counted(me: Runner) -> None:
            stand_by(me)  # returns once it has taken the lead from a leader in a long step
            taken.append(True)

        worker._stand_by = counted  # type: ignore[method-assign]

    _, sock, thread = _served(4, count)
    runs = 40
    with sock:
        sock.sendall(b"".join(ipc.frame(slot, run_message(f"{slot} * 2")) for slot in range(1, runs + 1)))
        for _ in range(runs):
            _, message = receive_any(sock)
            assert isinstance(message, ipc.Finished) and message.ok, message
    thread.join(timeout=5)
    assert taken == []


class _Mailbox(list[ipc.ToWorker]):
    """A slot's mailbox that counts the messages moved up as one is taken from its front."""

    moved = 0

    def pop(self, index: SupportsIndex = -1) -> ipc.ToWorker:
        if index == 0:
            _Mailbox.moved += len(self) - 1
        return super().pop(index)


def test_results_arriving_while_a_slot_drains_are_each_taken_once_in_order_and_none_moved() -> None:
    """100,000 parallel tool calls answered at once: while the first leader drains the slot, the next
    reads the results into its mailbox faster than they are taken. Taking each from the front of that
    list moved all the others up: time growing with the square of their number, 8 to 60 s in all."""
    _, theirs = socket.socketpair()
    worker = Worker(theirs, None, threads=2)
    hosted = Hosted(1, time.monotonic(), mailbox=_Mailbox([ipc.Settle(call_id=0, ok=True)]), scheduled=True)
    count = 20_000
    taken: list[int] = []

    def take(slot: Hosted, message: ipc.ToWorker | list[ipc.Settle], me: Runner | None) -> ipc.ToolCalls:
        assert isinstance(message, list)  # the results that arrived together, taken in one step
        taken.extend(settle.call_id for settle in message)
        if taken == [0]:  # meanwhile the next leader read every other result
            for call_id in range(1, count):
                worker._dispatch(1, ipc.Settle(call_id=call_id, ok=True))
        return ipc.ToolCalls(calls=[], logs=[])

    worker.hosted[1] = hosted
    worker._take = take  # type: ignore[method-assign]
    worker._drain(hosted, None)
    assert taken == list(range(count)) and not hosted.scheduled
    assert _Mailbox.moved < count


def test_a_run_of_tool_results_is_taken_in_one_step_and_nothing_moves_past_an_abort() -> None:
    settles = [ipc.Settle(call_id=n, ok=True) for n in range(4)]
    abort = ipc.Abort()
    assert _batched([settles[0], settles[1], abort, settles[2], settles[3]]) == [
        [settles[0], settles[1]],
        abort,
        [settles[2], settles[3]],
    ]


def switches(pid: int) -> dict[str, int]:
    """Each of the process's threads: how often it has left the CPU of its own accord. A guest
    computing never does; a held guest does each time it is held (it waits off the CPU), however
    many cores and however busy the machine."""
    counts = {}
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        with contextlib.suppress(OSError):
            line = next(line for line in status.read_text().splitlines() if line.startswith("voluntary_ctxt"))
            counts[status.parent.name] = int(line.split()[1])
    return counts


def cpu_ticks_of_threads(pid: int) -> dict[str, int]:
    ticks = {}
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            ticks[stat.parent.name] = int(fields[11]) + int(fields[12])
    return ticks


def test_a_share_holds_the_guests_computing_beyond_it_in_turns_but_never_a_short_step() -> None:
    process, sock = start_worker("--max-memory", str(64 << 20), "--threads", "4")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        sock.sendall(b"".join(ipc.frame(slot, run_message(SPINNING, budget=30)) for slot in (1, 2)))
        spinning(sock, 1, 2)
        first, before = cpu_ticks_of_threads(process.pid), switches(process.pid)
        # The guests' threads: computing, never leaving the CPU of their own accord (for as long as
        # the machine takes to give both CPU time: each second of it is a hundred ticks).
        spinners: list[str] = []
        deadline = time.monotonic() + 30
        while len(spinners) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            then, unshared = cpu_ticks_of_threads(process.pid), switches(process.pid)
            spinners = [t for t in then if then[t] > first.get(t, then[t]) and unshared[t] == before.get(t)]
        assert len(spinners) == 2, (first, then, before, unshared)
        sock.sendall(ipc.frame(0, ipc.Share(1)))
        # Held in turns: each hold leaves the CPU (how often in a second depends on the CPU they get:
        # see the rotation's own test below).
        held, deadline = 0, time.monotonic() + 30
        while held < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
            shared = switches(process.pid)
            held = sum(shared[tid] - unshared[tid] for tid in spinners)
        assert held >= 4, [shared[t] - unshared[t] for t in spinners]
        sock.sendall(ipc.frame(3, run_message("6 * 7", budget=30)))
        # Not held (a short step): next, before the guests held beside it end (their 30 s budgets).
        assert receive(sock, 3) == ipc.Finished(True, b"42", None, "", [])
        for slot in (1, 2):  # a held guest takes its abort at once (its log line went out)
            sock.sendall(ipc.frame(slot, ipc.Abort()))
            assert receive(sock, slot) == ipc.Finished(False, None, "timeout", TIMEOUT_MESSAGE, [])
    process.wait(timeout=30)


class FakeGuest:
    """What ``Turns`` asks of a guest: to be held and let go."""

    def __init__(self) -> None:
        self.held = False

    def hold(self) -> bool:
        self.held = True
        return True

    def let_go(self) -> None:
        self.held = False


def test_turns_hold_the_surplus_in_rotation_and_let_all_go_when_the_share_is_lifted() -> None:
    turns = Turns(lambda run: None)  # no thread: each look is made here, at chosen times
    guests = [FakeGuest() for _ in range(3)]
    first = time.monotonic()
    for fake in guests:
        turns.stepping(fake)  # type: ignore[arg-type]
    last = time.monotonic()
    turns.share(1)
    assert first + LONG_S <= turns._turn(last) <= last + LONG_S  # none computing yet: look as they turn long
    computing: list[int] = []
    now = last + LONG_S
    for look in range(6):
        next_look = turns._turn(now)
        assert next_look == now + QUANTUM_S
        running = [index for index, fake in enumerate(guests) if not fake.held]
        assert len(running) == 1, (look, running)
        computing += running
        now = next_look
    assert sorted(computing) == [0, 0, 1, 1, 2, 2]  # each in turn, a quantum at a time
    turns.stepped(guests[computing[-1]])  # type: ignore[arg-type]  # it ends its step: another takes the turn
    turns._turn(now)
    assert sum(not fake.held for fake in guests) == 2  # the ended one is let go too, and one more
    turns.share(0)
    assert turns._turn(now) == math.inf and not any(fake.held for fake in guests)
