"""A private daemon for one process: what ``Runner.local()`` starts and stops.

The daemon is the same ``execbox-runner serve`` (same sandboxed workers), run
as a child process on loopback with a random token that only this process
knows (passed in the environment, so it is not in the process listing). Other
``EXECBOX_RUNNER_*`` variables of the caller are not passed on, so nothing in
the environment can widen who may use it. It gets its own session, so a Ctrl-C
at the terminal reaches this process, whose context manager stops it by PID; and it watches this
process, so it drains and stops by itself if this one dies without stopping it (killed, crashed).
One daemon process (not one per core) is plenty for one host process and
starts faster; ``daemon_args`` can say otherwise. A daemon that exits while in use (killed,
crashed) is started again by the next execution, so one failure does not end the host's.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import IO, Final

from .errors import RunnerUnavailable

STOP_TIMEOUT_S: Final = 10.0
_LISTENING: Final = re.compile(rb"listening on (ws://\S+)")


class LocalDaemon:
    def __init__(self, args: Sequence[str] = (), startup_timeout: float = 60.0) -> None:
        self.args = list(args)
        self.startup_timeout = startup_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._endpoint: tuple[str, str] = ("", "")
        self._lock = threading.RLock()  # a restart and a stop, one at a time

    def start(self) -> tuple[str, str]:
        """Start the daemon and wait until it is ready; its URL and token. Stops it again on any failure."""
        token = secrets.token_urlsafe(32)
        environment = {name: value for name, value in os.environ.items() if not name.startswith("EXECBOX_RUNNER_")}
        environment["EXECBOX_RUNNER_TOKENS"] = token
        environment["EXECBOX_RUNNER_OWNER"] = str(os.getpid())  # it drains and stops if this process dies first
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 -- lives as long as the daemon; closed by stop()
        command = [sys.executable, "-m", "execbox_runner", "serve", "--host", "127.0.0.1", "--port", "0"]
        self._process = subprocess.Popen(
            [*command, "--processes", "1", "--log-level", "WARNING", "--drain-grace", "1", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=environment,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + self.startup_timeout
            url = self._listening_url(deadline)
            self._wait_until_ready(url, deadline)
        except BaseException:
            self.stop()
            raise
        self._endpoint = url, token
        return self._endpoint

    def exited(self, within: float = 0.0) -> bool:
        """Whether the daemon, once started, has exited since (killed, crashed) without ``stop``;
        waiting up to ``within`` seconds for it to: a daemon just killed refuses connections a
        moment before it has exited."""
        process = self._process
        if process is None:
            return False
        if within > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(within)
        return process.poll() is not None

    def restarted(self, unreachable: tuple[str, str] | None = None, within: float = 0.0) -> tuple[str, str]:
        """Start the daemon again if it has exited; its URL and token either way. Executions that
        find it gone at the same time start one daemon between them. ``unreachable``: the endpoint
        an execution could not connect to, whose daemon is given ``within`` seconds to finish
        exiting; if another execution has started a new one meanwhile, that one's endpoint at once."""
        with self._lock:
            if unreachable in (None, self._endpoint) and self.exited(within):
                self.stop()
                self.start()
            return self._endpoint

    def stop(self) -> None:
        """SIGTERM (a graceful drain), then SIGKILL if it lingers; safe to call twice."""
        with self._lock:
            process, self._process = self._process, None
            if process is not None:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    try:
                        process.wait(timeout=STOP_TIMEOUT_S)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait()
                if process.stdout is not None:
                    process.stdout.close()
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None

    def _listening_url(self, deadline: float) -> str:
        """The URL from the daemon's first stdout line, read without blocking past the deadline."""
        assert self._process is not None and self._process.stdout is not None
        stdout = self._process.stdout
        line = b""
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while b"\n" not in line and (remaining := deadline - time.monotonic()) > 0:
                if selector.select(remaining):
                    chunk = os.read(stdout.fileno(), 4096)
                    if not chunk:
                        break  # the daemon exited
                    line += chunk
        found = _LISTENING.search(line)
        if found is None:
            raise self._failure(f"it did not say where it listens (got {line[:200]!r})")
        return found.group(1).decode()

    def _wait_until_ready(self, url: str, deadline: float) -> None:
        """Poll ``/readyz`` until the warm workers are up."""
        host, port = url.removeprefix("ws://").rstrip("/").rsplit(":", 1)
        while time.monotonic() < deadline:
            connection = http.client.HTTPConnection(host, int(port), timeout=max(0.1, deadline - time.monotonic()))
            try:
                with contextlib.suppress(OSError, http.client.HTTPException):
                    connection.request("GET", "/readyz")
                    if connection.getresponse().status == 200:
                        return
            finally:
                connection.close()
            time.sleep(0.02)
        raise self._failure(f"it was not ready within {self.startup_timeout:g} s")

    def _failure(self, what: str) -> RunnerUnavailable:
        assert self._process is not None and self._stderr is not None
        self._stderr.seek(0)
        log = self._stderr.read()[-2000:].decode("utf-8", "replace")
        status = self._process.poll()
        exited = f" (it exited with status {status})" if status is not None else ""
        return RunnerUnavailable(f"the local execbox-runner daemon did not start: {what}{exited}; its log:\n{log}")
