"""A real daemon in a subprocess, and a small WebSocket host to talk to it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from websockets.sync.client import ClientConnection, connect

STARTUP_TIMEOUT_S = 60.0
OPTIONS = {"timeoutMs": 5000, "memoryLimitBytes": 67108864, "maxLogLines": 100, "maxLogChars": 64000}
TOOLS = [{"name": "tools", "tools": {n: {"safeName": n, "originalName": n} for n in ("echo", "hang")}, "types": ""}]


@dataclass
class Daemon:
    url: str
    process: subprocess.Popen[str]

    def children(self) -> list[int]:
        """PIDs of the daemon's child processes (its workers)."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    with open(f"/proc/{entry}/stat") as stat:
                        if int(stat.read().rsplit(")", 1)[1].split()[1]) == self.process.pid:
                            pids.append(int(entry))
        return pids


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@contextlib.contextmanager
def running_daemon(*args: str, env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """Start ``execbox-runner serve`` on a free loopback port; stop it (by PID) afterwards."""
    process = subprocess.Popen(
        [sys.executable, "-m", "execbox_runner.cli", "serve", "--host", "127.0.0.1", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        line = ""
        while time.monotonic() < deadline and "listening on" not in line:
            line = process.stdout.readline() if process.stdout else ""
            if not line and process.poll() is not None:
                raise RuntimeError(f"daemon exited: {process.stderr.read() if process.stderr else ''}")
        match = re.search(r"ws://\S+", line)
        assert match, f"no listening line: {line!r}"
        yield Daemon(url=match.group(0), process=process)
    finally:
        stop(process)


def stop(process: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
    return process.returncode


def execute(exec_id: str, code: str, **options: Any) -> str:
    return json.dumps({"type": "execute", "id": exec_id, "code": code, "options": {**OPTIONS, **options}, "providers": TOOLS})


def receive(ws: ClientConnection, timeout: float = 10.0) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=timeout))


def run_to_done(ws: ClientConnection, exec_id: str, code: str, answer: Any = None, **options: Any) -> dict[str, Any]:
    """Send an execute, answer every tool_call with ``answer`` (default: echo), return the done."""
    ws.send(execute(exec_id, code, **options))
    for _ in range(10_000):
        message = receive(ws)
        if message["type"] == "tool_call":
            result = message.get("input") if answer is None else answer
            ws.send(json.dumps({"type": "tool_result", "callId": message["callId"], "ok": True, "result": result}))
        elif message["type"] == "done":
            return message
    raise AssertionError("no done")


def client(url: str) -> ClientConnection:
    return connect(url, open_timeout=10, close_timeout=5, max_size=None)
