"""Every worker exit is one log line saying why, and is counted by reason (issue 14, item 4):
stopped by the daemon (retired, misbehaved, shutting down...) or died on its own (a signal,
told apart from the daemon's own SIGKILL, or an exit status). Real daemons, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import textwrap
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from execbox_runner.daemon.pool import pool as pool_module
from execbox_runner.daemon.pool.pool import WorkerPool
from execbox_runner.daemon.pool.worker import WorkerLost
from execbox_runner.protocol import ipc

from .daemonkit import Daemon, client, execute, receive, run_to_done, running_daemon, running_daemon_with_site, stop
from .poolkit import Execution, running_pool, running_zygote

WAIT_S = 10.0  # a bound on how long a line may take to appear, not a measurement

MISBEHAVING_CHANNEL = textwrap.dedent(
    """
    import os

    if os.environ.get("EXECBOX_TEST_MISBEHAVING_WORKER"):
        from execbox_runner.protocol import ipc

        _frame = ipc.frame

        def frame(slot, message):
            if isinstance(message, ipc.Finished) and message.result == b'"deep result"':
                return _frame(slot, ipc.Finished(True, b"[" * 100_000 + b"]" * 100_000, None, "", []))
            if isinstance(message, ipc.Finished) and message.result == b'"wrong slot"':
                return _frame(slot + 1000, message)
            return _frame(slot, message)

        ipc.frame = frame
    """
)


def exit_lines(daemon: Daemon) -> list[dict[str, Any]]:
    return [
        line
        for line in (json.loads(text) for text in daemon.log_lines() if text.startswith("{"))
        if line.get("logger") == "execbox_runner.daemon.pool.pool" and "exit_reason" in line
    ]


def exit_line(daemon: Daemon, pid: int) -> dict[str, Any]:
    """The one line that says how worker ``pid`` ended, once it is written."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        lines = [line for line in exit_lines(daemon) if line["worker_pid"] == pid]
        if lines:
            assert len(lines) == 1, lines
            return lines[0]
        time.sleep(0.05)
    raise AssertionError(f"no exit line for worker {pid}: {exit_lines(daemon)}")


@contextlib.contextmanager
def parked(daemon: Daemon, exec_id: str) -> Iterator[Any]:
    """A connection whose execution awaits a tool that never answers."""
    with client(daemon.url) as ws:
        ws.send(execute(exec_id, "await tools.hang({})", timeoutMs=60_000))
        assert receive(ws)["type"] == "started"
        assert receive(ws)["type"] == "tool_call"
        yield ws


@pytest.mark.parametrize(
    ("sig", "reason", "words"),
    [
        (signal.SIGSEGV, "signal_SIGSEGV", "died of SIGSEGV"),
        (signal.SIGKILL, "signal_SIGKILL", "not sent by the daemon"),
        (signal.SIGXCPU, "signal_SIGXCPU", "RLIMIT_CPU"),
    ],
)
def test_a_worker_that_dies_of_a_signal_says_which_with_the_executions_it_held(
    sig: signal.Signals, reason: str, words: str
) -> None:
    with running_daemon("--warm-workers", "1") as d:
        (worker,) = d.workers()  # the warm spare, which the first execution claims
        with contextlib.ExitStack() as stack:
            sessions = [stack.enter_context(parked(d, f"p{i}")) for i in range(2)]
            os.kill(worker, sig)
            assert {receive(ws)["error"]["code"] for ws in sessions} == {"internal_error"}
        line = exit_line(d, worker)
        assert (line["level"], line["exit_reason"], line["executions_held"]) == ("warning", reason, 2)
        assert words in line["message"] and line["message"].endswith("; replaced")
        with client(d.url) as ws:  # replaced: the daemon serves on
            assert run_to_done(ws, "after", "1 + 1")["result"] == 2
        metrics_url = d.url.replace("ws://", "http://").rstrip("/") + "/metrics"
        with urllib.request.urlopen(metrics_url, timeout=WAIT_S) as answer:
            metrics = answer.read().decode()
        assert f'execbox_worker_exits_total{{reason="{reason}"}} 1.0' in metrics.splitlines()
        # After a crash (SIGSEGV) the spare forked by the same zygote is retired too (test_zygote_renewal.py).
        exits = [
            float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("execbox_worker_exits_total")
        ]
        assert f"execbox_worker_restarts_total {sum(exits)}" in metrics.splitlines()


def test_a_retired_worker_and_the_shutdown_are_info_lines_with_their_reason() -> None:
    with running_daemon("--warm-workers", "1", "--max-executions-per-worker", "1") as d:
        with client(d.url) as ws:
            assert run_to_done(ws, "only", "await tools.echo(1)")["result"] == 1
        retired = _wait_for(d, lambda lines: [line for line in lines if line["exit_reason"] == "retired"])
        assert len(retired) == 1 and retired[0]["level"] == "info"
        assert (retired[0]["executions_held"], retired[0]["executions_served"]) == (0, 1)
        spares = d.workers()
        assert stop(d.process) == 0
        stopped = {line["worker_pid"]: line for line in exit_lines(d) if line["exit_reason"] == "shutdown"}
    assert set(spares) <= set(stopped) and {line["level"] for line in stopped.values()} == {"info"}


@pytest.fixture(scope="module")
def misbehaving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    site = tmp_path_factory.mktemp("misbehaving")
    with running_daemon_with_site(site, MISBEHAVING_CHANNEL, "EXECBOX_TEST_MISBEHAVING_WORKER") as d:
        yield d


@pytest.mark.parametrize("code", ["'deep result'", "'wrong slot'"])
def test_a_worker_killed_for_misbehaving_says_so(misbehaving: Daemon, code: str) -> None:
    """Deep JSON (the session finds it invalid) or a frame for a slot it was never given (the pool does;
    the execution, which that worker never answered, is placed on another, which misbehaves too)."""
    before = set(misbehaving.workers())
    with client(misbehaving.url) as ws:
        assert run_to_done(ws, "bad", code)["error"]["code"] == "internal_error"
    killed = _wait_for(misbehaving, lambda lines: [line for line in lines if line["worker_pid"] in before])
    assert killed and all(line["exit_reason"] == "misbehaved" and line["level"] == "warning" for line in killed)
    assert all("killed by the daemon" in line["message"] for line in killed)


def _wait_for(daemon: Daemon, select: Any) -> list[dict[str, Any]]:
    """``select(exit lines)`` once it is not empty (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while not (found := select(exit_lines(daemon))) and time.monotonic() < deadline:
        time.sleep(0.05)
    return list(found)


# ------------------------------------------------------------------ the pool's counts


@pytest.fixture
async def pool() -> AsyncIterator[WorkerPool]:
    async with running_pool() as pool:
        yield pool


async def wait_exits(pool: WorkerPool, count: int) -> None:
    with trio.fail_after(WAIT_S):
        while pool.exits < count:
            await trio.sleep(0.02)


async def test_the_pool_counts_exits_by_reason(pool: WorkerPool) -> None:
    lease = await Execution(pool, "tenant").leased()
    os.kill(lease.worker.pid, signal.SIGTERM)  # not a crash: the other workers serve on
    await wait_exits(pool, 1)
    assert pool.exit_reasons == {"signal_SIGTERM": 1}
    pool.release(lease)
    # Two executions are this pool's worker lifetime: the second retires its worker.
    for _ in range(2):
        execution = Execution(pool, "tenant")
        lease = await execution.leased()
        lease.send(ipc.Run("1", 5.0, 1 << 24, 10, 1000, [], 1 << 20))
        assert isinstance(await execution.receive(), ipc.Finished)
        pool.release(lease)
    await wait_exits(pool, 2)
    assert pool.exit_reasons == {"signal_SIGTERM": 1, "retired": 1}
    assert pool.exits == sum(pool.exit_reasons.values()) == 2


async def test_a_worker_that_outlived_its_zygote_still_says_how_it_died(pool: WorkerPool) -> None:
    """The zygote is gone, so the daemon's reaper learns the orphan's status instead."""
    lease = await Execution(pool, "tenant").leased()
    with trio.fail_after(WAIT_S):  # the spare that replaces the one claimed is up: no fork under way
        while pool.starting or len(pool.workers) < 2:
            await trio.sleep(0.02)
    assert pool.zygote.process is not None
    pool.zygote.process.kill()
    with trio.fail_after(WAIT_S):
        while _parent(lease.worker.pid) != os.getpid():  # the orphan comes back to us, a subreaper
            await trio.sleep(0.02)
    os.kill(lease.worker.pid, signal.SIGSEGV)
    with trio.fail_after(WAIT_S):  # (then the spare, of the same zygote's layout, is retired)
        while "signal_SIGSEGV" not in pool.exit_reasons:
            await trio.sleep(0.02)


async def test_a_worker_killed_at_its_cpu_time_backstop_says_so() -> None:
    """RLIMIT_CPU, soft and hard alike, ends a worker with SIGKILL: its zygote tells it from the OOM killer's."""
    async with running_pool("--cpu-seconds", "1") as pool:
        execution = Execution(pool)
        (await execution.leased()).send(ipc.Run("while (true) {}", 60.0, 1 << 24, 10, 1000, [], 1 << 20))
        with pytest.raises(WorkerLost):
            # A second of CPU takes a worker, at its lowered priority, far longer on a loaded machine.
            await execution.receive(timeout=50)
        await wait_exits(pool, 1)
        assert pool.exit_reasons == {"cpu_limit": 1}


async def test_a_tenants_idle_worker_is_stopped_once_idle_for_its_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """An execution's end does not wake the pool: it sleeps until the first idle worker's time."""
    idle_s = 0.5
    monkeypatch.setattr(pool_module, "TENANT_IDLE_S", idle_s)
    async with running_pool() as pool:
        execution = Execution(pool, "tenant")
        lease = await execution.leased()
        lease.send(ipc.Run("1", 5.0, 1 << 24, 10, 1000, [], 1 << 20))
        assert isinstance(await execution.receive(), ipc.Finished)
        released = trio.current_time()
        pool.release(lease)
        await wait_exits(pool, 1)
        assert pool.exit_reasons == {"idle": 1}
        assert trio.current_time() - released >= idle_s


async def test_forks_asked_together_each_get_their_own_workers_pid() -> None:
    """The zygote answers fork requests in order: each channel is paired with its own worker's PID
    (killing that PID closes that channel and no other)."""
    async with running_zygote() as forks:
        await forks.fork(4)
        forked = forks.forked
        assert len({pid for pid, _ in forked}) == 4
        for pid, channel in forked:
            channel.setblocking(False)
            os.kill(pid, signal.SIGKILL)
            with trio.fail_after(WAIT_S):
                while _open(channel):  # its Ready, perhaps, then the end of its channel
                    await trio.lowlevel.wait_readable(channel)
                    with contextlib.suppress(BlockingIOError):
                        channel.recv(1 << 16)
            open_channels = [other for other_pid, other in forked if other_pid != pid and other.fileno() >= 0]
            for other in open_channels:
                assert _open(other), f"killing {pid} closed another worker's channel"
            channel.close()


def _open(channel: socket.socket) -> bool:
    """Whether the worker's end of ``channel`` is still open (its Ready may be waiting unread)."""
    try:
        data = channel.recv(1 << 16, socket.MSG_DONTWAIT | socket.MSG_PEEK)
    except BlockingIOError:
        return True
    return bool(data)


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_exit_statuses_of_real_processes_read_as_their_reasons() -> None:
    """The wait statuses the zygote reports, from real processes: a signal, an exit status."""
    from execbox_runner.daemon.pool.worker import exit_cause

    def status_of(command: list[str], sig: int | None = None) -> int:
        child = subprocess.Popen(command)
        if sig is not None:
            os.kill(child.pid, sig)
        return os.waitpid(child.pid, 0)[1]

    assert exit_cause(status_of(["sh", "-c", "exit 3"]), None).reason == "exit_3"
    assert exit_cause(status_of(["sleep", "60"], signal.SIGTERM), "idle").reason == "signal_SIGTERM"
    killed = status_of(["sleep", "60"], signal.SIGKILL)
    assert exit_cause(killed, None).reason == "signal_SIGKILL"
    assert exit_cause(killed, "idle").reason == "idle"  # the daemon's own SIGKILL
    assert exit_cause(None, "stuck").reason == "unknown"
