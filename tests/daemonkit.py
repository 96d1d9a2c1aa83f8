"""A real daemon in a subprocess, and a small WebSocket host to talk to it."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import trustme
from execbox_runner_conformance.connection import Connection
from execbox_runner_conformance.connection import connect as connect_one_thread
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect
from websockets.sync.server import ServerConnection, serve

STARTUP_TIMEOUT_S = 60.0
LOG_WAIT_S = 10.0
# prctl(PR_SET_CHILD_SUBREAPER), then exec the real command line.
AS_SUBREAPER = "import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
OPTIONS = {"timeoutMs": 5000, "memoryLimitBytes": 67108864, "maxLogLines": 100, "maxLogChars": 64000}
TOOLS = [{"name": "tools", "tools": {n: {"safeName": n, "originalName": n} for n in ("echo", "hang")}, "types": ""}]


@dataclass
class Daemon:
    url: str
    process: subprocess.Popen[str]
    stderr: IO[str]
    listening_line: str  # the daemon's first stdout line, which ends with ``url``

    def log_lines(self, until: Callable[[list[str]], bool] | None = None) -> list[str]:
        """What the daemon has written to stderr so far; with ``until``, once that holds of them (or
        after ``LOG_WAIT_S``): the daemon writes its lines from a thread of its own, a little after
        the answers of the moment they were logged in."""
        deadline = time.monotonic() + LOG_WAIT_S
        while True:
            self.stderr.flush()
            self.stderr.seek(0)
            lines = self.stderr.read().splitlines()
            if until is None or until(lines) or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)

    def json_lines(self, until: Callable[[list[dict[str, Any]]], bool] | None = None) -> list[dict[str, Any]]:
        """The daemon's JSON log lines, parsed; ``until`` as for ``log_lines``."""

        def parsed(lines: list[str]) -> list[dict[str, Any]]:
            return [json.loads(line) for line in lines if line.startswith("{")]

        return parsed(self.log_lines(None if until is None else lambda lines: until(parsed(lines))))

    def descriptors(self) -> list[str]:
        """What the daemon's descriptors refer to, less its brief reads of /proc (a worker's memory,
        several times a second): what it holds, for a count that a read in flight does not skew."""
        held = []
        for fd in os.listdir(f"/proc/{self.process.pid}/fd"):
            with contextlib.suppress(FileNotFoundError):  # closed since the listing
                target = os.readlink(f"/proc/{self.process.pid}/fd/{fd}")
                if not target.startswith("/proc/"):
                    held.append(f"{fd}: {target}")
        return held

    def descriptors_within(self, limit: int, timeout: float) -> list[str]:
        """The daemon's descriptors once they number at most ``limit``, or after ``timeout``: the last
        sample, for the caller to check (its workers' channels and pidfds close as they are replaced)."""
        deadline = time.monotonic() + timeout
        while len(held := self.descriptors()) > limit and time.monotonic() < deadline:
            time.sleep(0.05)
        return held

    def workers(self) -> list[int]:
        """PIDs of the daemon's workers: the children of its zygote (its one child)."""
        return [pid for zygote in children_of(self.process.pid) for pid in children_of(zygote)]


def children_of(parent: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == parent:
                    pids.append(int(entry))
    return pids


def process_state(pid: int) -> str:
    """The process state letter (``Z`` for a zombie); ``gone`` once it has been reaped."""
    return _state(f"/proc/{pid}/stat")


def thread_states(pid: int) -> list[str]:
    """The state letter of each thread of ``pid`` (``T``: stopped); none once it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [state for tid in tids if (state := _state(f"/proc/{pid}/task/{tid}/stat")) != "gone"]


def _state(path: str) -> str:
    try:
        with open(path) as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@contextlib.contextmanager
def running_daemon_with_site(
    directory: Path, sitecustomize: str, flag: str, *args: str, env: dict[str, str] | None = None
) -> Iterator[Daemon]:
    """A daemon (started with ``args``, and ``env`` added to its environment) whose Python processes run ``sitecustomize`` first (placed
    in ``directory``), with the environment variable ``flag`` set: how tests turn a worker into a
    misbehaving one, or the daemon's disk into a slow one. The module sets ``flag`` itself, for the
    zygote and its workers, which the daemon starts without its environment's other variables."""
    (directory / "sitecustomize.py").write_text(f"import os\nos.environ[{flag!r}] = '1'\n{sitecustomize}")
    path = os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
    with running_daemon(*args, env={**(env or {}), "PYTHONPATH": path, flag: "1"}) as daemon:
        yield daemon


def certificate(directory: Path) -> tuple[Path, Path, ssl.SSLContext]:
    """A certificate for 127.0.0.1 in ``directory``, and a client context that trusts it."""
    authority = trustme.CA()
    issued = authority.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = directory / "tls.crt", directory / "tls.key"
    issued.cert_chain_pems[0].write_to_path(str(certfile))
    issued.private_key_pem.write_to_path(str(keyfile))
    trusted = ssl.create_default_context()
    authority.configure_trust(trusted)
    return certfile, keyfile, trusted


@contextlib.contextmanager
def running_daemon(
    *args: str,
    env: dict[str, str] | None = None,
    subreaper: bool = False,
    stderr_fd: int | None = None,
    own_group: bool = False,
) -> Iterator[Daemon]:
    """Start ``execbox-runner serve`` on a free loopback port; stop it (by PID) afterwards.

    One daemon process unless ``args`` say otherwise, so that ``Daemon.workers``
    sees every worker (a supervisor's shards are tested in test_supervisor.py).

    The daemon's stderr goes to a file, so a chatty daemon never blocks on a
    pipe nobody drains, and it is shown when start-up fails. ``subreaper`` starts
    it as a child subreaper already (the flag survives exec), as PID 1 in a
    container is: orphans below it become its children. ``stderr_fd``: the daemon's stderr goes
    there instead (``Daemon.log_lines`` then has nothing). ``own_group``: the daemon leads a process
    group of its own, which a test may signal whole without signalling itself.
    """
    launcher = [sys.executable, "-c", AS_SUBREAPER] if subreaper else [sys.executable]
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = subprocess.Popen(
            [
                *launcher,
                "-m",
                "execbox_runner",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--processes",
                "1",
                *args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr if stderr_fd is None else stderr_fd,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=own_group,
        )
        try:
            line = _listening_line(process, stderr)
            yield Daemon(url=line.split()[-1], process=process, stderr=stderr, listening_line=line)
        finally:
            stop(process)
            assert process.stdout is not None
            process.stdout.close()


def _listening_url(process: subprocess.Popen[str], stderr: IO[str]) -> str:
    """The URL the daemon reports as it starts serving."""
    return _listening_line(process, stderr).split()[-1]


def _listening_line(process: subprocess.Popen[str], stderr: IO[str]) -> str:
    """The daemon's first stdout line, ending with its URL, read on a thread so the wait is bounded."""
    lines: queue.Queue[str] = queue.Queue()
    stdout = process.stdout
    assert stdout is not None
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=STARTUP_TIMEOUT_S)
    except queue.Empty:
        line = ""
    if re.search(r"listening on wss?://\S+$", line.strip()) is None:
        stderr.seek(0)
        raise RuntimeError(
            f"the daemon did not report its URL (got {line!r}, exit code {process.poll()}); stderr:\n{stderr.read()[-2000:]}"
        )
    return line.strip()


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
    return json.dumps(
        {"type": "execute", "id": exec_id, "code": code, "options": {**OPTIONS, **options}, "providers": TOOLS}
    )


# A host's WebSocket: websockets' threaded client, or over TLS the harness's own (see ``client``).
HostConnection = ClientConnection | Connection


def receive(ws: HostConnection, timeout: float = 10.0) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=timeout))


def run_to_done(ws: HostConnection, exec_id: str, code: str, answer: Any = None, **options: Any) -> dict[str, Any]:
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


def client(url: str, **options: Any) -> HostConnection:
    """A host connection; ``options`` go to websockets (e.g. additional_headers, ssl, origin).

    Over TLS (``ssl``), the conformance harness's connection, which reads and writes on one thread:
    websockets' threaded client stalls about one TLS session in 200 (conformance/connection.py)."""
    if "ssl" in options:
        context = options.pop("ssl")
        headers = list(dict(options.pop("additional_headers", {})).items())
        assert not options, f"not supported over TLS here: {sorted(options)}"
        return connect_one_thread(
            url, additional_headers=headers, ssl_context=context, open_timeout=10, close_timeout=5
        )
    return connect(url, open_timeout=10, close_timeout=5, max_size=None, **options)


@contextlib.contextmanager
def scripted_runner(
    script: Callable[[ServerConnection, list[Any]], None], **options: Any
) -> Iterator[tuple[str, list[Any]]]:
    """A WebSocket server on loopback that plays ``script`` for each connection and records what it was sent;
    ``options`` go to websockets' ``serve``."""
    received: list[Any] = []

    def handler(connection: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            script(connection, received)

    with serve(handler, "127.0.0.1", 0, **options) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}/", received
        finally:
            server.shutdown()
            thread.join(10)
