"""Several daemon processes on one port (``--processes``), and memory admission."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from .daemonkit import children_of, client, process_state, run_to_done, running_daemon, stop
from .test_operations import metric


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def http(ws_url: str, path: str) -> str:
    return "http" + ws_url[2:].rstrip("/") + path


def shards_of(supervisor: int) -> list[int]:
    """The supervisor's daemon processes (its other children are orphans adopted to be reaped)."""
    shards = []
    for pid in children_of(supervisor):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"serve" in cmdline.read().split(b"\0"):
                    shards.append(pid)
        except OSError:
            continue
    return shards


def tree(root: int) -> list[int]:
    found, frontier = [], [root]
    while frontier:
        kids = children_of(frontier.pop())
        found += kids
        frontier += kids
    return found


def test_shards_share_the_port_metrics_and_the_drain() -> None:
    with running_daemon("--processes", "2", "--warm-workers", "2", "--max-sessions", "7") as d:
        shards = shards_of(d.process.pid)
        assert len(shards) == 2
        for index in range(12):
            with client(d.url) as ws:
                assert run_to_done(ws, f"e{index}", f"await tools.echo({index})")["result"] == index
        # Whichever shard answers, /metrics counts the executions of both.
        for _ in range(4):
            status, body = get(http(d.url, "/metrics"))
            assert status == 200
            assert 'execbox_executions_total{code="",outcome="ok"} 12.0' in body
            # Each shard admits its share, rounded up (4): together they admit 8.
            assert "\nexecbox_max_sessions 8.0\n" in body
        processes = [d.process.pid, *tree(d.process.pid)]
        assert stop(d.process, signal.SIGTERM) == 0
        assert not [pid for pid in processes if os.path.exists(f"/proc/{pid}") and process_state(pid) != "Z"]


def test_shards_outlive_the_threads_that_started_them() -> None:
    """Shards keep serving past trio's idle-thread timeout (~10 s): a shard bound to the life of
    the supervisor *thread* that started it would drain then."""
    with running_daemon("--processes", "2", "--warm-workers", "2") as d:
        shards = children_of(d.process.pid)
        time.sleep(12)
        assert sorted(children_of(d.process.pid)) == sorted(shards)
        for index in range(4):
            with client(d.url) as ws:
                assert run_to_done(ws, f"e{index}", "1 + 1")["result"] == 2
        # The machine-sized maximum is the daemon's, shared by its shards, not each shard's.
        maximum = metric(get(http(d.url, "/metrics"))[1], "execbox_max_sessions")
    info = subprocess.run(
        [sys.executable, "-m", "execbox_runner", "info", "--json"], capture_output=True, text=True, timeout=60
    )
    assert maximum - json.loads(info.stdout)["limits"]["max_sessions"] in (0, 1)  # each share rounded up


def test_a_killed_shard_is_replaced() -> None:
    """Also as PID 1 of a container would run it (a subreaper): the dead shard's zygote and workers
    come back to the supervisor and must be reaped, not left zombies."""
    with running_daemon("--processes", "2", "--warm-workers", "2", subreaper=True) as d:
        victim = shards_of(d.process.pid)[0]
        os.kill(victim, signal.SIGKILL)
        # Its replacement starts, and the dead shard's zygote and workers, which came back to the
        # supervisor (a subreaper), exit and are reaped: only the two shards remain, no zombie.
        for _ in range(400):
            children = children_of(d.process.pid)
            if len(shards_of(d.process.pid)) == 2 and victim not in children and len(children) == 2:
                break
            time.sleep(0.05)
        children = children_of(d.process.pid)
        assert victim not in children and sorted(children) == sorted(shards_of(d.process.pid))
        assert len(children) == 2 and not [pid for pid in children if process_state(pid) == "Z"]
        for index in range(6):
            with client(d.url) as ws:
                assert run_to_done(ws, f"e{index}", "1 + 1")["result"] == 2


def test_near_the_memory_budget_new_sessions_get_503() -> None:
    """A budget below what the idle daemon tree already holds: every handshake is refused."""
    with running_daemon("--memory-budget-bytes", str(32 << 20)) as d:
        health: dict[str, Any] = json.loads(get(http(d.url, "/healthz"))[1])
        assert health["memory"]["budget_bytes"] == 32 << 20
        for _ in range(100):  # the first sample lands within a quarter second
            if json.loads(get(http(d.url, "/healthz"))[1])["memory"]["used_bytes"] > 32 << 20:
                break
            time.sleep(0.05)
        status, body = get(http(d.url, "/"))
        assert status == 503 and json.loads(body)["error"] == "memory"
        metrics = get(http(d.url, "/metrics"))[1]
        assert 'execbox_rejected_handshakes_total{reason="memory"} 1.0' in metrics
        assert "execbox_memory_used_bytes" in metrics


def test_a_daemon_process_that_cannot_listen_stops_the_supervisor_with_its_one_line() -> None:
    """The metrics port is the shards' to bind: taken, the first shard says so and exits 1, and so
    does the supervisor, without a second line of its own."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        flags = ["--port", "0", "--processes", "2", "--metrics-port", str(port), "--log-level", "ERROR"]
        result = subprocess.run(
            [sys.executable, "-m", "execbox_runner", "serve", *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"execbox-runner: cannot serve on 127.0.0.1:{port}: Address already in use"
        " (another process listens there: stop it, or choose another port)"
    ]
