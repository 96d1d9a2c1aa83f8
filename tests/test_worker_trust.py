"""A worker taken over by an attacker (issue 11, section 2): the daemon applies the
execution's log limits itself, bounds what it buffers, and answers deep JSON
from the worker with ``internal_error``, staying alive for other sessions.

The hostile worker is a real one whose channel is rewritten on the way out: a
``sitecustomize`` module, loaded by the zygote before it forks, wraps
``ipc.frame`` and acts on results the guest asks for by name.
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .daemonkit import Daemon, client, run_to_done, running_daemon_with_site

MIB = 1 << 20

HOSTILE_CHANNEL = textwrap.dedent(
    """
    import os

    if os.environ.get("EXECBOX_TEST_HOSTILE_WORKER"):
        from execbox_runner.protocol import ipc

        _frame = ipc.frame
        LINE = "x" * (1 << 20)
        DEEP = b"[" * 100_000 + b"]" * 100_000

        def frame(slot, message):
            if isinstance(message, ipc.Finished) and message.result == b'"flood in many messages"':
                flood = b"".join(_frame(slot, ipc.ToolCalls(calls=[], logs=[LINE] * 24)) for _ in range(10))
                return flood + _frame(slot, ipc.Finished(True, b"1", None, "", [LINE] * 20))
            if isinstance(message, ipc.Finished) and message.result == b'"flood in one message"':
                return _frame(slot, ipc.Finished(True, b"1", None, "", [LINE] * 240))
            if isinstance(message, ipc.Finished) and message.result == b'"deep result"':
                return _frame(slot, ipc.Finished(True, DEEP, None, "", []))
            if isinstance(message, ipc.ToolCalls):
                calls = [(i, p, t, DEEP if v == b'"deep input"' else v) for i, p, t, v in message.calls]
                return _frame(slot, ipc.ToolCalls(calls, message.logs))
            return _frame(slot, message)

        ipc.frame = frame

        import socket
        from execbox_runner.worker import loop

        _send = loop.Worker._send

        def send(self, slot, message, **options):
            if isinstance(message, ipc.Finished) and message.result == b'"send descriptors"':
                with self.send_lock:  # its own channel (the one it has), with the result
                    socket.send_fds(self.sock, [ipc.frame(slot, message)], [self.sock.fileno()] * 3)
                return
            _send(self, slot, message, **options)

        loop.Worker._send = send
    """
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon_with_site(
        tmp_path_factory.mktemp("hostile"), HOSTILE_CHANNEL, "EXECBOX_TEST_HOSTILE_WORKER"
    ) as d:
        yield d


WARM = 2  # the unfiltered daemon's spares


@pytest.fixture(scope="module")
def unfiltered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The hostile worker without its seccomp filter (as off x86-64), which would refuse it to pass
    descriptors: the daemon's own defence, for the hosts where the filter is not there."""
    with running_daemon_with_site(
        tmp_path_factory.mktemp("unfiltered"),
        HOSTILE_CHANNEL,
        "EXECBOX_TEST_HOSTILE_WORKER",
        "--sandbox",
        "false",
        "--warm-workers",
        str(WARM),
    ) as d:
        yield d


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def test_the_daemon_truncates_a_workers_logs_to_the_executions_limits(daemon: Daemon) -> None:
    """240 lines of 1 MiB in ten messages come back as the spec's truncation of them."""
    with client(daemon.url) as ws:
        # 240 MiB to read and truncate: time enough for it on a loaded machine.
        done = run_to_done(ws, "e1", "'flood in many messages'", timeoutMs=60_000, maxLogLines=100, maxLogChars=64_000)
        assert (done["ok"], done["logs"]) == (True, ["x" * 64_000])
        done = run_to_done(
            ws, "e2", "'flood in many messages'", timeoutMs=60_000, maxLogLines=3, maxLogChars=2 * MIB + 10
        )
        assert [len(line) for line in done["logs"]] == [MIB, MIB, 10]
    # Buffered one message at a time: the daemon's peak is far below the 240 MiB sent.
    assert status_kib(daemon.process.pid, "VmHWM") < 200 * 1024


def test_a_worker_message_over_the_frame_bound_is_internal_error(daemon: Daemon) -> None:
    with client(daemon.url) as ws:
        done = run_to_done(ws, "e1", "'flood in one message'")
        assert (done["ok"], done["error"]["code"]) == (False, "internal_error")
        assert run_to_done(ws, "e2", "1 + 1")["result"] == 2


@pytest.mark.parametrize("code", ["'deep result'", "await tools.echo('deep input')"])
def test_deep_json_from_a_worker_is_internal_error(daemon: Daemon, code: str) -> None:
    with client(daemon.url) as ws:
        before = set(daemon.workers())
        done = run_to_done(ws, "e1", code)
        assert (done["ok"], done["error"]["code"]) == (False, "internal_error")
        assert "deeper than" in done["error"]["message"]
        # The worker that sent it may be taken over: it is killed, not given more executions.
        for _ in range(200):
            if not before <= set(daemon.workers()):
                break
            time.sleep(0.05)
        assert not before <= set(daemon.workers())
        assert run_to_done(ws, "e2", "[[[1]]]")["result"] == [[[1]]]  # the daemon is alive


def test_a_worker_that_sends_descriptors_is_killed_and_every_one_is_closed(unfiltered: Daemon) -> None:
    """The red team once saw the daemon's descriptors go from 19 to 21 after a hijacked worker sent
    some: none is ever kept, and the worker that tries is killed (so is the one the execution,
    never answered, was placed on next)."""
    daemon = unfiltered
    with client(daemon.url) as ws:
        assert run_to_done(ws, "warm", "1")["ok"]
    # Counted once every spare has started, as they all have again at the end (a channel and a pidfd each).
    deadline = time.monotonic() + 30
    while len(daemon.workers()) < WARM and time.monotonic() < deadline:
        time.sleep(0.05)
    held = daemon.descriptors()
    with client(daemon.url) as ws:
        done = run_to_done(ws, "fds", "'send descriptors'")
        assert (done["error"]["code"], done["error"]["message"]) == (
            "internal_error",
            "Runner failure: worker sent file descriptors",
        )
        assert run_to_done(ws, "after", "6 * 7")["result"] == 42
    after = daemon.descriptors_within(len(held), timeout=30)
    assert len(after) <= len(held), (held, after)
