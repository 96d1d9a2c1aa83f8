"""A worker counts an execution's ``timeoutMs`` from the Run's arrival, not from when a runner
thread becomes free to take it: the wait for a thread is part of the execution's time."""

from __future__ import annotations

from execbox_runner.protocol import ipc

from .guestkit import run_message
from .test_sandbox import receive, spin_run, start_worker


def test_a_run_that_waited_for_a_runner_past_its_budget_times_out() -> None:
    process, sock = start_worker("--max-memory", str(64 << 20), "--threads", "1")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        # The only runner spins for 0.5 s; the quick run behind it has 0.2 s from its arrival.
        sock.sendall(ipc.frame(1, spin_run(0.5)) + ipc.frame(2, run_message("1", budget=0.2)))
        spinner = receive(sock, 1)
        assert isinstance(spinner, ipc.Finished) and spinner.code == "timeout"
        queued = receive(sock, 2)
        assert isinstance(queued, ipc.Finished) and queued.code == "timeout"
    process.wait(timeout=30)


def test_a_run_that_waited_less_than_its_budget_runs() -> None:
    process, sock = start_worker("--max-memory", str(64 << 20), "--threads", "1")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        sock.sendall(ipc.frame(1, spin_run(0.2)) + ipc.frame(2, run_message("1", budget=30)))
        assert receive(sock, 1).code == "timeout"  # type: ignore[union-attr]
        queued = receive(sock, 2)
        assert isinstance(queued, ipc.Finished) and queued.ok, queued
    process.wait(timeout=30)


def test_a_worker_ends_a_spinning_guest_at_its_deadline_with_its_logs() -> None:
    """No Abort from the daemon is needed: the worker's own deadline ends the execution as one would."""
    process, sock = start_worker("--max-memory", str(64 << 20), "--threads", "2")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        sock.sendall(ipc.frame(1, run_message("console.log('spinning'); while (true) {}", budget=0.3)))
        finished = receive(sock, 1)
        assert isinstance(finished, ipc.Finished) and finished.code == "timeout"
        assert finished.logs == ["spinning"]
    process.wait(timeout=30)
