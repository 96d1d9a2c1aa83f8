"""An execution whose worker dies before answering its run is placed on another worker: nothing of it
had reached the host. One that the worker answered (a log line, a tool call) ends with
``internal_error``; a run is placed again only once."""

from __future__ import annotations

import contextlib
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from .daemonkit import (
    Daemon,
    client,
    execute,
    receive,
    run_to_done,
    running_daemon,
    running_daemon_with_site,
    thread_states,
)


def stop_all(daemon: Daemon, sig: int) -> list[int]:
    """Send ``sig`` to every worker; a SIGSTOP, once every thread of theirs has stopped (bounded): on
    a busy machine a thread stops only once it is scheduled, and may read the channel before."""
    pids = daemon.workers()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + 10
    while sig == signal.SIGSTOP and not all(map(stopped, pids)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return pids


def stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (or the process is gone)."""
    return all(state == "T" for state in thread_states(pid))


@pytest.mark.parametrize("profile", ["standard", "hardened"])
def test_a_run_its_dead_worker_never_answered_runs_on_another(profile: str) -> None:
    """The red team's case: the next execution went to a worker just killed, and ended
    ``internal_error`` before the daemon had noticed the death. Stopped workers never read the run,
    and are then killed."""
    with running_daemon("--profile", profile, "--warm-workers", "1") as daemon:
        with client(daemon.url) as ws:
            stopped = stop_all(daemon, signal.SIGSTOP)
            assert len(stopped) == 1  # the warm spare, ready before the daemon listened
            ws.send(execute("e1", "1 + 1"))
            assert receive(ws)["type"] == "started"
            time.sleep(0.3)  # the run went to the stopped worker; the pool starts another spare
            with contextlib.suppress(ProcessLookupError):  # on a busy machine the daemon may be first
                os.kill(stopped[0], signal.SIGKILL)
            done = receive(ws, timeout=60)
        assert (done["type"], done.get("result"), done.get("error")) == ("done", 2, None)
        placed = daemon.json_lines(
            lambda lines: any("placing it on another worker" in line["message"] for line in lines)
        )
        assert any("placing it on another worker" in line["message"] for line in placed)


def test_a_hosts_execution_id_cannot_forge_a_text_log_line() -> None:
    """The line of a run placed again names the execution in its message: an id with a line break
    stays on that line, escaped, rather than writing a line of the host's own."""
    forged = "e1\n2026-01-01 00:00:00,000 CRITICAL execbox_runner: forged"
    with running_daemon("--log-format", "text", "--warm-workers", "1") as daemon:
        with client(daemon.url) as ws:
            (spare,) = stop_all(daemon, signal.SIGSTOP)
            ws.send(execute(forged, "1 + 1"))
            assert receive(ws)["type"] == "started"
            time.sleep(0.3)  # the run went to the stopped worker
            with contextlib.suppress(ProcessLookupError):
                os.kill(spare, signal.SIGKILL)
            assert receive(ws, timeout=60)["result"] == 2
        lines = daemon.log_lines(lambda lines: any("placing it on another worker" in line for line in lines))
    assert not [line for line in lines if line.startswith("2026-01-01")]  # no line of the host's
    (placed,) = [line for line in lines if "placing it on another worker" in line]
    assert "execution e1\\n2026-01-01 00:00:00,000 CRITICAL execbox_runner: forged: worker" in placed


def test_an_answered_execution_is_not_run_again() -> None:
    with running_daemon("--warm-workers", "2") as daemon, client(daemon.url) as ws:
        ws.send(execute("e1", "await tools.echo(1); while (true) {}", timeoutMs=60_000))
        assert receive(ws)["type"] == "started"
        call = receive(ws)
        assert call["type"] == "tool_call"
        stop_all(daemon, signal.SIGKILL)
        done = receive(ws, timeout=60)
        assert (done["type"], done["error"]["code"]) == ("done", "internal_error")
        second = run_to_done(ws, "e2", "6 * 7")
        assert second.get("result") == 42, second


DIES_ON_READING = textwrap.dedent(
    """
    import os

    if os.environ.get("EXECBOX_TEST_DYING_WORKER"):
        from execbox_runner.protocol import ipc
        from execbox_runner.worker import loop

        _dispatch = loop.Worker._dispatch

        def dispatch(self, slot, message):
            if isinstance(message, ipc.Run) and "kill the worker" in message.code:
                os._exit(3)
            _dispatch(self, slot, message)

        loop.Worker._dispatch = dispatch
    """
)


def test_a_run_whose_every_worker_dies_before_answering_is_placed_again_only_once(tmp_path: Path) -> None:
    """A guest that kills the worker it lands on (an engine bug, say) costs two workers, not all."""
    with (
        running_daemon_with_site(
            tmp_path, DIES_ON_READING, "EXECBOX_TEST_DYING_WORKER", "--warm-workers", "2"
        ) as daemon,
        client(daemon.url) as ws,
    ):
        ws.send(execute("e1", "'kill the worker'"))
        assert receive(ws)["type"] == "started"
        done = receive(ws, timeout=60)
        assert (done["type"], done["error"]["code"]) == ("done", "internal_error")
        second = run_to_done(ws, "e2", "6 * 7")
        assert second.get("result") == 42, second
        lines = daemon.json_lines(
            lambda lines: sum("exited on its own with status 3" in line["message"] for line in lines) >= 2
        )
    assert sum("placing it on another worker" in line["message"] for line in lines) == 1
    assert sum("exited on its own with status 3" in line["message"] for line in lines) == 2
