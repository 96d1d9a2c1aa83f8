"""Runners take turns (``loop.Worker._runner``): the one holding the turn runs short steps while
another stands by, and a long step lets the others go on without it."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from execbox_runner.protocol import ipc
from execbox_runner.worker import loop
from execbox_runner.worker.guest import GuestRun, Runtime
from execbox_runner.worker.loop import TURN_CHECK_S, Worker, recv_exactly

from .guestkit import run_message
from .test_sandbox import receive, start_worker


def test_a_guest_spinning_with_the_turn_holds_up_no_neighbour() -> None:
    process, sock = start_worker("--max-memory", str(64 << 20), "--threads", "2")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        sock.sendall(ipc.frame(1, run_message("while (true) {}", budget=3)))
        time.sleep(0.1)  # its runner took the turn and spins
        sent = time.monotonic()
        sock.sendall(ipc.frame(2, run_message("6 * 7")))
        quick = receive(sock, 2)
        assert isinstance(quick, ipc.Finished) and quick.result == b"42"
        assert time.monotonic() - sent < 0.5
        spinner = receive(sock, 1)
        assert isinstance(spinner, ipc.Finished) and spinner.code == "timeout"
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
            (length,) = ipc.HEADER.unpack(recv_exactly(sock, ipc.HEADER.size))
            slot, message = ipc.from_worker_decoder.decode(recv_exactly(sock, length))
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
    spare = _spare_after_one_execution(threads=2, wait=5)
    assert spare is not None and spare.context.eval("typeof console.log") == "function"


def test_a_worker_with_one_runner_makes_no_spare() -> None:
    # A spare takes well under 0.5 s to make (~0.3 ms; the other test waits for one up to 5 s).
    assert _spare_after_one_execution(threads=1, wait=0.5) is None


class _SlowToMake(GuestRun):
    """A guest whose making (runtime, normalized code) takes 2 ms of CPU, twice ``TURN_CHECK_S``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        end = time.thread_time() + 2 * TURN_CHECK_S
        while time.thread_time() < end:
            pass
        super().__init__(*args, **kwargs)


def test_making_a_guest_never_counts_as_a_long_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # A loaded worker once counted it: every runner went on without the turn, and contended for the GIL.
    monkeypatch.setattr(loop, "GuestRun", _SlowToMake)
    went_on: list[bool] = []

    def count(worker: Worker) -> None:
        take_turn = worker._take_turn

        def counted(clock: int) -> bool:
            taken = take_turn(clock)
            if not taken:
                went_on.append(True)
            return taken

        worker._take_turn = counted  # type: ignore[method-assign]

    _, sock, thread = _served(4, count)
    runs = 40
    with sock:
        sock.sendall(b"".join(ipc.frame(slot, run_message(f"{slot} * 2")) for slot in range(1, runs + 1)))
        for _ in range(runs):
            (length,) = ipc.HEADER.unpack(recv_exactly(sock, ipc.HEADER.size))
            _, message = ipc.from_worker_decoder.decode(recv_exactly(sock, length))
            assert isinstance(message, ipc.Finished) and message.ok, message
    thread.join(timeout=5)
    assert went_on == []
