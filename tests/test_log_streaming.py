"""A guest's log lines leave its worker as they are written, so that whoever ends the execution (the
worker or the daemon, at a deadline, on a cancel, for memory, or because the worker died) has every
line written until a few milliseconds before: the ring (``worker/logring.py``) and the log pump."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from execbox_runner.protocol import ipc
from execbox_runner.worker import logring
from execbox_runner.worker.guest import GuestRun
from execbox_runner.worker.loop import recv_exactly
from execbox_runner.worker.runtime import STACK_BYTES

from .daemonkit import Daemon, client, execute, receive, running_daemon
from .guestkit import run
from .test_sandbox import start_worker
from .test_worker_turns import _served

MIB = 1 << 20


def log_run(code: str, budget: float = 60.0) -> ipc.Run:
    """A ``Run`` whose log limits keep everything the tests log."""
    return ipc.Run(
        code=code,
        budget_s=budget,
        memory_limit=256 * MIB,
        max_log_lines=100_000,
        max_log_chars=10_000_000,
        providers=[],
        max_output_bytes=16 * MIB,
    )


def raw(sock: socket.socket) -> tuple[int, ipc.FromWorker]:
    """The worker's next frame, exactly as sent."""
    (length,) = ipc.HEADER.unpack(recv_exactly(sock, ipc.HEADER.size))
    return ipc.from_worker_decoder.decode(recv_exactly(sock, length))


@contextlib.contextmanager
def worker() -> Iterator[socket.socket]:
    """A confined worker process, ready."""
    process, sock = start_worker("--max-memory", str(512 * MIB), "--threads", "2")
    with sock:
        assert isinstance(raw(sock)[1], ipc.Ready)
        yield sock
    process.wait(timeout=30)


def test_a_spinning_guests_lines_leave_the_worker_while_it_spins() -> None:
    """Before, they stayed in the engine until the guest was stopped: a daemon that answered the
    deadline or the cancel first sent ``done`` without them."""
    with worker() as sock:
        sock.settimeout(30)
        sock.sendall(ipc.frame(1, log_run("console.log('a'); console.log('b', 2); while (true) {}")))
        streamed = raw(sock)  # no Abort yet: the guest still spins
        assert streamed == (1, ipc.ToolCalls(calls=[], logs=["a", "b 2"]))
        sock.sendall(ipc.frame(1, ipc.Abort()))
        slot, finished = raw(sock)
        assert slot == 1 and isinstance(finished, ipc.Finished)
        assert (finished.code, finished.logs) == ("timeout", [])  # nothing twice


def lines_of(code: str, sock: socket.socket, count: int) -> list[str]:
    """What the worker streams of a spinning guest's ``count`` lines, then the rest after an Abort."""
    sock.settimeout(60)
    sock.sendall(ipc.frame(1, log_run(code)))
    logs: list[str] = []
    while len(logs) < count:
        slot, message = raw(sock)
        assert slot == 1 and isinstance(message, ipc.ToolCalls) and not message.calls, message
        logs += message.logs
    sock.sendall(ipc.frame(1, ipc.Abort()))
    slot, finished = raw(sock)
    assert isinstance(finished, ipc.Finished) and finished.code == "timeout"
    return logs + finished.logs


def test_lines_longer_than_the_ring_and_floods_of_lines_come_whole_and_in_order() -> None:
    big = 3 * logring.CAPACITY + 17
    code = (
        f"for (let i = 0; i < 3; i++) console.log(String(i).repeat({big}));"
        "for (let i = 0; i < 5000; i++) console.log('line', i, '\\u00e9\\ud83d\\ude00', '\\ud800');"
        "while (true) {}"
    )
    with worker() as sock:
        logs = lines_of(code, sock, 5003)
    assert logs[:3] == [str(i) * big for i in range(3)]
    assert logs[3:] == [f"line {i} \u00e9\U0001f600 \ufffd" for i in range(5000)]


def test_the_ring_of_every_execution_goes_back_to_the_pool() -> None:
    _, sock, thread = _served(2)
    regions = len(logring._regions)
    with sock:
        for slot in range(1, 3 * logring.REGION_SLOTS):
            code = "console.log('x'.repeat(10000)); await null; console.log('y'); 1"
            sock.sendall(ipc.frame(slot, log_run(code)))
            while not isinstance(message := raw(sock)[1], ipc.Finished):
                pass
            assert message.ok
    thread.join(timeout=5)
    assert len(logring._regions) == regions


def _written(address: int) -> bool:
    """Whether the page at ``address`` of this process is one of its own (written), not the zero page
    a read maps (``/proc/self/pagemap``: present, and exclusively mapped)."""
    try:
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(address // mmap.PAGESIZE * 8)
            (entry,) = struct.unpack("<Q", pagemap.read(8))
    except OSError as exc:
        pytest.skip(f"no pagemap: {exc}")
    return bool(entry >> 63 and entry >> 56 & 1)


def test_a_ring_no_line_went_through_leaves_its_memory_unwritten() -> None:
    """A guest that logs nothing costs its ring no page, while it runs or once the ring is back in
    the pool: a worker that parked thousands of such guests keeps no page per slot after they end."""
    guest = GuestRun(log_run("await null; 1"), streamed=True)
    ring = guest.ring
    assert ring is not None
    ring._region.memory.madvise(mmap.MADV_DONTNEED, ring._offset, logring.SLOT_BYTES)  # a slot used before
    assert not _written(ring.address)
    finished = guest.start()
    assert isinstance(finished, ipc.Finished) and finished.ok
    assert ring.closed and not _written(ring.address)


def test_a_guest_run_without_a_log_pump_keeps_its_lines_until_its_step_reports() -> None:
    """Nothing reads a ring while a ``GuestRun`` driven directly runs (tests, the engine's training):
    its lines wait in the engine, as many as the limits keep."""
    finished = run("console.log('z'.repeat(200000)); console.log('end')", chars=10**6)
    assert finished.logs == ["z" * 200_000, "end"]


def test_lines_streamed_by_another_thread_are_not_reported_again() -> None:
    guest = GuestRun(log_run("for (let i = 0; i < 20000; i++) console.log(i); await null; 'done'"), streamed=True)
    streamed: list[str] = []
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set():
            guest.stream(streamed.extend)
            time.sleep(0.001)

    pumping = threading.Thread(target=pump)
    pumping.start()
    outcome: list[ipc.ToolCalls | ipc.Finished] = []
    previous = threading.stack_size(STACK_BYTES)
    try:
        stepping = threading.Thread(target=lambda: outcome.append(guest.start()))
        stepping.start()
    finally:
        threading.stack_size(previous)
    stepping.join()
    stop.set()
    pumping.join()
    (finished,) = outcome
    assert isinstance(finished, ipc.Finished) and finished.result == b'"done"'
    assert streamed + finished.logs == [str(i) for i in range(20000)]


# ---------------------------------------------------------------- the daemon


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon("--warm-workers", "2") as d:
        yield d


def test_a_worker_killed_while_its_guest_spins_leaves_the_lines_it_wrote(daemon: Daemon) -> None:
    with client(daemon.url) as ws:
        ws.send(execute("e1", "console.log('before'); while (true) {}", timeoutMs=60_000))
        assert receive(ws)["type"] == "started"
        time.sleep(2)  # the guest logged and spins; the line is the daemon's within milliseconds
        for pid in daemon.workers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        done = receive(ws, timeout=30)
    assert (done["type"], done["error"]["code"], done["logs"]) == ("done", "internal_error", ["before"])


# Guests that spin on every core for the whole test, and hosts that end spinning guests by timeout
# and by cancel, each guest having written its lines before (its tool call shows it): none of them
# may be missing.
SATURATORS = 2 * (os.cpu_count() or 1)
HOSTS = 8
EACH = 250  # executions per host: half timeouts, half cancels


def spin_forever(url: str, stop: threading.Event, failures: list[str]) -> None:
    try:
        with client(url) as ws:
            ws.send(execute("spin", "while (true) {}", timeoutMs=300_000))
            assert receive(ws)["type"] == "started"
            stop.wait(600)
            ws.send(json.dumps({"type": "cancel", "id": "spin"}))
            assert receive(ws, timeout=60)["type"] == "done"
    except Exception as exc:
        failures.append(f"a saturating guest failed: {exc!r}")


def end_spinning_guests(url: str, host: int, failures: list[str], proven: list[str]) -> None:
    try:
        _end_spinning_guests(url, host, failures, proven)
    except Exception as exc:
        failures.append(f"host {host} failed: {exc!r}")


def _end_spinning_guests(url: str, host: int, failures: list[str], proven: list[str]) -> None:
    """Each guest's tool call shows its lines written; a guest that timed out before it (its
    worker saturated) may have written some of them, in order."""
    with client(url) as ws:
        for n in range(EACH):
            exec_id = f"h{host}-{n}"
            timeout = bool(n % 2)  # a timeout, or a cancel after the tool call
            code = "console.log('a'); console.log('b'); await tools.echo(1); while (true) {}"
            ws.send(execute(exec_id, code, timeoutMs=300 if timeout else 60_000))
            assert receive(ws, timeout=60)["type"] == "started"
            message: dict[str, Any] = receive(ws, timeout=60)
            called = message["type"] == "tool_call"
            if called:
                proven.append(exec_id)
                ws.send(json.dumps({"type": "tool_result", "callId": message["callId"], "ok": True, "result": 1}))
                if not timeout:
                    time.sleep(0.2)
                    ws.send(json.dumps({"type": "cancel", "id": exec_id}))
                message = receive(ws, timeout=60)
            elif not timeout:
                failures.append(f"{exec_id}: no tool call but {json.dumps(message)}")
                continue
            logs = message.get("logs")
            kept = logs == ["a", "b"] if called else logs in (["a", "b"], ["a"], [])
            ended = (message["type"], message["id"], message.get("error", {}).get("code"))
            if ended != ("done", exec_id, "timeout") or not kept:
                failures.append(json.dumps(message))


def test_no_line_is_lost_to_timeouts_and_cancels_on_a_saturated_machine(daemon: Daemon) -> None:
    stop = threading.Event()
    failures: list[str] = []
    saturators = [threading.Thread(target=spin_forever, args=(daemon.url, stop, failures)) for _ in range(SATURATORS)]
    for thread in saturators:
        thread.start()
    try:
        time.sleep(1)  # every core is busy
        proven: list[str] = []  # the executions whose lines were written: their tool call came
        hosts = [
            threading.Thread(target=end_spinning_guests, args=(daemon.url, h, failures, proven)) for h in range(HOSTS)
        ]
        for thread in hosts:
            thread.start()
        for thread in hosts:
            thread.join(timeout=600)
    finally:
        stop.set()
        for thread in saturators:
            thread.join(timeout=120)
    assert failures == [], f"{len(failures)} of {HOSTS * EACH} lost lines, e.g. {failures[:3]}"
    # Every cancel's guest made its call; so must a good share of the timeouts' in 300 ms.
    assert len(proven) >= HOSTS * EACH * 3 // 4, f"{len(proven)} of {HOSTS * EACH} guests showed their lines written"


def test_the_log_pump_and_the_interrupter_keep_the_daemons_priority() -> None:
    """Guests run niced, below the daemon; a line they wrote must not wait behind them on a busy
    machine, nor must their deadline."""
    process, sock = start_worker("--max-memory", str(512 * MIB), "--threads", "2")
    with sock:
        assert isinstance(raw(sock)[1], ipc.Ready)
        nice = {}
        for task in os.listdir(f"/proc/{process.pid}/task"):
            with open(f"/proc/{process.pid}/task/{task}/stat") as stat:
                nice[int(task)] = int(stat.read().rsplit(")", 1)[1].split()[16])
    process.wait(timeout=30)
    values = list(nice.values())
    # Besides them, the quickjs package's own helper thread keeps it too; the three runners are niced.
    assert values.count(0) >= 3 and values.count(10) >= 3 and set(values) == {0, 10}, nice
