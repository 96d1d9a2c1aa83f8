"""One start-up line per daemon process says what it serves, where, within which limits and
with which protections: structured fields in JSON mode, a readable sentence in text mode."""

from __future__ import annotations

import json
from typing import Any

from execbox_runner import __version__
from execbox_runner.daemon.startup import engine, listening_line

from .daemonkit import Daemon, running_daemon
from .test_deploy import free_port

STARTUP_PREFIX = f"execbox-runner {__version__} ("


def startup_lines(daemon: Daemon) -> list[dict[str, Any]]:
    """The start-up lines, there once the daemon prints its URL (they are logged before it)."""
    lines = [json.loads(line) for line in daemon.log_lines() if line.startswith("{")]
    return [line for line in lines if line["message"].startswith(STARTUP_PREFIX)]


def test_the_startup_line_has_the_limits_and_protections_as_fields() -> None:
    metrics_port = free_port()
    args = ("--tokens", "t", "--metrics-port", str(metrics_port), "--metrics-token", "m")
    limits = ("--max-sessions", "12", "--max-workers", "3", "--worker-capacity", "50", "--idle-timeout", "7")
    with running_daemon(*args, *limits, "--memory-budget-bytes", str(3 << 30), "--max-timeout-ms", "9000") as d:
        (line,) = startup_lines(d)
    assert line["level"] == "info"
    assert line["version"] == __version__ and line["profile"] == "standard" and line["shard"] == ""
    assert line["engine"] == engine() and line["engine"].startswith("quickjs-ng ")
    assert line["listen"] == [d.url]
    assert line["metrics_listen"] == [f"http://127.0.0.1:{metrics_port}/metrics"]
    assert (line["authentication"], line["metrics_token"]) == (True, True)
    assert (line["max_sessions"], line["max_workers"], line["worker_capacity"]) == (12, 3, 50)
    assert line["timeouts_s"] == {"execution": 9.0, "idle": 7.0, "handshake": 10.0, "send": 10.0, "drain_grace": 25.0}
    assert line["max_memory_limit_bytes"] == 512 << 20 and line["memory_budget_bytes"] == 3 << 30
    assert "seccomp" in line["protections"] or "rlimits" in line["protections"]
    assert line["unsafe_settings"] == [name for name in line["unsafe_settings"] if name == "no_network_namespace"]
    message = line["message"]
    for part in (d.url, f"127.0.0.1:{metrics_port}/metrics", "metrics token required", "at most 12 sessions"):
        assert part in message, message
    assert "3 workers of 50 executions" in message and "memory budget 3.0 GiB" in message


def test_the_startup_line_reads_in_text_mode_and_names_the_hardened_profile() -> None:
    with running_daemon("--log-format", "text", "--profile", "hardened", "--sandbox", "false") as d:
        # Logged before the daemon prints its URL, so it is there once the daemon is.
        (line,) = [line for line in d.log_lines() if STARTUP_PREFIX in line]
    assert " INFO execbox_runner.daemon.server: " in line
    assert "(hardened) serving ws://127.0.0.1:" in line
    assert f"; engine {engine()}; at most " in line
    assert "of 1 executions each" in line  # a hardened worker hosts one execution
    assert "executions up to 300 s and 512 MiB each" in line
    assert "unsafe: sandbox_off, no_authentication" in line


def test_every_shard_logs_its_own_line_with_its_share() -> None:
    with running_daemon("--processes", "2", "--max-sessions", "10", "--max-workers", "4") as d:
        lines = startup_lines(d)
    assert sorted(line["shard"] for line in lines) == ["0/2", "1/2"]
    assert [(line["max_sessions"], line["max_workers"]) for line in lines] == [(5, 2), (5, 2)]
    assert lines[0]["memory_budget_bytes"] == lines[1]["memory_budget_bytes"]


def test_the_stdout_line_names_the_engine_with_one_daemon_process_or_several() -> None:
    for processes in ("1", "2"):
        with running_daemon("--processes", processes) as d:
            assert d.listening_line == listening_line(d.url)
