"""The scripts' child processes (the daemon, the floor server, the load client): started here, stopped by PID.

Nothing else is ever signalled: the benchmark may run next to other daemons.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

STARTUP_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 10.0
DAEMON_LISTENING: Final = "listening on ws://"
_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parent.parent)  # the directory holding benchkit/


@dataclass
class Server:
    """A server subprocess and the URL it printed (and the file its log lines go to, if any)."""

    process: subprocess.Popen[str]
    url: str
    log: IO[str] | None = None

    def stop(self) -> None:
        """Close its stdin; SIGTERM, then SIGKILL if it lingers (only this process, by its PID)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not None:
            self.log.close()


def with_pythonpath(*first: str | None) -> dict[str, str]:
    """This process's environment with ``first`` (those given) ahead of its ``PYTHONPATH``."""
    path = os.pathsep.join(p for p in (*first, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, **({"PYTHONPATH": path} if path else {})}


def popen_module(
    module: str, *args: str, stdin: int | None = None, checkout: Path | None = None
) -> subprocess.Popen[str]:
    """Run ``python -m benchkit.<module> args`` with a text stdout pipe, importable from any working
    directory; ``checkout``: that checkout's module and package (run from it, as ``start_daemon``)."""
    first = (str(checkout / "benchmarks"), str(checkout)) if checkout is not None else (_PACKAGE_ROOT,)
    return subprocess.Popen(
        [sys.executable, "-m", f"benchkit.{module}", *args],
        stdin=stdin,
        stdout=subprocess.PIPE,
        text=True,
        env=with_pythonpath(*first),
        cwd=checkout,
    )


class Lines:
    """A child's stdout lines, read on a thread, so that each wait for one is bounded and the caller can work meanwhile."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        stdout = process.stdout
        self.queue: queue.Queue[str] = queue.Queue()

        def read() -> None:
            for line in stdout:
                self.queue.put(line)
            self.queue.put("")  # EOF

        threading.Thread(target=read, daemon=True).start()

    def get(self, timeout: float) -> str | None:
        """The next line ("" at EOF), or None if none came within ``timeout`` seconds."""
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None


def start_server(process: subprocess.Popen[str], marker: str) -> Server:
    """Wait (at most ``STARTUP_TIMEOUT_S``) for ``process`` to print its ``... listening on ws://...`` line.

    The lines are read on a thread, so a server that hangs before printing it
    (or prints nothing) cannot hang the benchmark; it is killed instead.
    """
    lines = Lines(process)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while line := lines.get(max(0.0, deadline - time.monotonic())):
        if marker in line:
            return Server(process, line.strip().rsplit(" ", 1)[-1])
    process.kill()
    process.wait()
    raise RuntimeError(f"{process.args!r} did not report listening within {STARTUP_TIMEOUT_S:g} s")


def start_daemon(
    warm_workers: int | None = None,
    extra_args: list[str] | None = None,
    prefix: list[str] | None = None,
    checkout: Path | None = None,
    pythonpath: str | None = None,
) -> Server:
    """``python -m execbox_runner serve`` on a free loopback port with default settings; ``prefix``
    runs it under another command (``taskset -c 0``). Its log lines (a line per execution) go to an
    unnamed temporary file, as a deployment's go to a file or a journal: they are part of what a
    default daemon spends (the last of them are shown if it fails to start). ``checkout``: that
    checkout's daemon (``-m`` imports from the working directory first, and the workers inherit
    it); ``pythonpath``: this first on its ``PYTHONPATH`` (a QuickJS build)."""
    argv = [*(prefix or []), sys.executable, "-m", "execbox_runner", "serve", "--host", "127.0.0.1", "--port", "0"]
    if warm_workers is not None:
        argv += ["--warm-workers", str(warm_workers)]
    argv += extra_args or []
    env = None
    if checkout is not None or pythonpath is not None:
        env = with_pythonpath(pythonpath, str(checkout) if checkout else None)
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - the Server closes it as it stops
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, cwd=checkout, env=env)
    try:
        server = start_server(process, DAEMON_LISTENING)
    except RuntimeError as exc:
        log.seek(0)
        tail = log.read()[-2000:]
        log.close()
        raise RuntimeError(f"{exc}; its last log lines:\n{tail}") from None
    server.log = log
    return server
