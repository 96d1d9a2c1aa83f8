"""The leader's reports wait to leave together while more steps are ready (``loop.Worker._lead``),
and never wait for an idle channel or for a long step."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from execbox_runner.protocol import ipc
from execbox_runner.worker import loop, runners
from execbox_runner.worker.guest import TIMEOUT_MESSAGE
from execbox_runner.worker.loop import Worker

from .guestkit import run_message
from .test_sandbox import receive, receive_any
from .test_worker_turns import _served

# Far beyond the sockets' timeout here: a report held this long fails the test.
HELD_FOREVER_S = 3600.0


class _CountedSocket:
    """The worker's end of its channel, counting the writes that carry a ``Finished``."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.finishing_writes = 0
        self._lock = threading.Lock()

    def sendall(self, data: bytes) -> None:
        frames, finished = ipc.Unframer(), False
        frames.feed(data)
        while (body := frames.next()) is not None:
            finished |= isinstance(ipc.from_worker_decoder.decode(body)[1], ipc.Finished)
        with self._lock:
            self.finishing_writes += finished
        self._sock.sendall(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


def _counted(worker: Worker) -> None:
    worker.sock = _CountedSocket(worker.sock)  # type: ignore[assignment]


def test_the_reports_of_runs_that_arrived_together_leave_in_a_few_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "HOLD_S", HELD_FOREVER_S)
    worker, sock, thread = _served(4, _counted)
    runs = 40
    sock.settimeout(30)
    with sock:
        sock.sendall(b"".join(ipc.frame(slot, run_message(f"{slot} * 2")) for slot in range(1, runs + 1)))
        results = dict(receive_any(sock) for _ in range(runs))
    thread.join(timeout=5)
    assert results == {slot: ipc.Finished(True, str(slot * 2).encode(), None, "", []) for slot in range(1, runs + 1)}
    # One write once nothing was ready, and one more for each time Runs arrived after that.
    assert 1 <= worker.sock.finishing_writes <= 4  # type: ignore[attr-defined]


def test_a_report_leaves_at_once_when_nothing_else_is_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "HOLD_S", HELD_FOREVER_S)
    _, sock, thread = _served(4)
    sock.settimeout(30)
    with sock:
        for slot in (1, 2, 3):  # one at a time: each report comes back before the next Run is sent
            code = "const r = await tools.echo({ n: 1 }); r.n + 1"
            sock.sendall(ipc.frame(slot, run_message(code, providers=[("tools", ["echo"])])))
            calls = receive(sock, slot)
            assert isinstance(calls, ipc.ToolCalls) and len(calls.calls) == 1
            sock.sendall(ipc.frame(slot, ipc.Settle(calls.calls[0][0], True, b'{"n": 41}')))
            assert receive(sock, slot) == ipc.Finished(True, b"42", None, "", [])
    thread.join(timeout=5)


def test_a_long_step_does_not_keep_the_reports_held_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "HOLD_S", HELD_FOREVER_S)
    _, sock, thread = _served(2)
    sock.settimeout(30)
    with sock:
        # The leader runs 1, holds its report while 2 is ready, then spins in 2: the standby takes
        # the lead, finds nothing ready and sends what the old leader held.
        sock.sendall(ipc.frame(1, run_message("6 * 7")) + ipc.frame(2, run_message("while (true) {}", budget=30)))
        assert receive(sock, 1) == ipc.Finished(True, b"42", None, "", [])
        sock.sendall(ipc.frame(2, ipc.Abort()))
        assert receive(sock, 2) == ipc.Finished(False, None, "timeout", TIMEOUT_MESSAGE, [])
    thread.join(timeout=5)


def test_a_report_made_while_the_lead_moves_is_not_left_held(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader decides to hold a report, but making its frame takes long enough for the standby to
    take the lead (a large result does): the report still leaves, though nothing else arrives."""
    monkeypatch.setattr(loop, "HOLD_S", HELD_FOREVER_S)
    frame = ipc.frame

    def slowly_made(slot: int, message: ipc.ToWorker | ipc.FromWorker) -> bytes:
        if isinstance(message, ipc.Finished):
            time.sleep(20 * runners.TURN_CHECK_S)  # a step's wall time the standby finds long
        return frame(slot, message)

    monkeypatch.setattr(ipc, "frame", slowly_made)
    _, sock, thread = _served(2)
    sock.settimeout(30)
    with sock:
        sock.sendall(frame(1, run_message("6 * 7")))
        assert receive(sock, 1) == ipc.Finished(True, b"42", None, "", [])
    thread.join(timeout=5)
