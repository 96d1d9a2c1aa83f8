"""Several daemon processes on one port: the network side on every core.

One Python process drives its WebSockets on one core. With ``--processes N``
(default: one per core) ``execbox-runner serve`` becomes a supervisor that
starts N shard daemons. Each binds the same address with ``SO_REUSEPORT``, so
the kernel spreads new connections across them, and each has its own zygote
and workers. The supervisor stays small: it prints the one URL, forwards
SIGTERM/SIGINT (every shard drains, each execution still gets its ``done``;
a second signal is forwarded too, and stops them at once), restarts a shard
that dies, and exits 0 when every shard drained cleanly, else 1. Shards share a
metrics directory, so ``/metrics`` from any of them covers all of them; with
``--metrics-port`` they share that port too, the same way, so the supervisor
itself serves nothing. Each shard logs its own start-up line, with its share.

A shard is the same command line with ``--processes 1``, its share of the
limits, the chosen port and ``EXECBOX_RUNNER_SHARD`` set; nothing else.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Final

import trio

from .config import Settings
from .observability.metrics import MULTIPROCESS_ENV, live_state_file
from .pool import reaper
from .startup import listening_line

log = logging.getLogger(__name__)

SHARD_ENV: Final = "EXECBOX_RUNNER_SHARD"  # "INDEX/COUNT", set for shards only
STARTUP_TIMEOUT_S: Final = 120.0
RESTART_PAUSE_S: Final = 1.0
SUPERVISOR_POLL_S: Final = 0.5


def is_shard() -> bool:
    return SHARD_ENV in os.environ


def shard_name() -> str:
    """``INDEX/COUNT`` of this shard, for its logs; empty when this process serves alone."""
    return os.environ.get(SHARD_ENV, "")


def shard_count() -> int:
    """How many daemon processes share the port (1 when this one serves alone)."""
    return int(os.environ[SHARD_ENV].partition("/")[2]) if is_shard() else 1


async def watch_supervisor() -> None:
    """In a shard: drain (by signalling ourselves) if the supervisor dies without forwarding a signal.

    Polled, not PR_SET_PDEATHSIG: that fires when the parent *thread* exits, and
    trio starts processes from its worker threads, which come and go.
    """
    parent = os.getppid()
    while os.getppid() == parent:
        await trio.sleep(SUPERVISOR_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)


def shard_arguments(settings: Settings, count: int, port: int) -> list[str]:
    """Flags appended to a shard's command line (argparse: the last occurrence wins)."""
    sessions = settings.max_sessions
    return [
        "--processes",
        "1",
        "--port",
        str(port),
        "--warm-workers",
        str(max(1 if settings.warm_workers else 0, settings.warm_workers // count)),  # 0 stays none
        "--max-workers",
        str(max(1, settings.max_workers // count)),
        *(["--max-sessions", str(math.ceil(sessions / count))] if sessions else []),
    ]


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound (with SO_REUSEPORT, not listening) to the port the shards will share.

    It resolves port 0 to one port for all shards and keeps it ours until they listen.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class Supervisor:
    def __init__(self, argv: list[str], settings: Settings, count: int) -> None:
        self.argv = argv
        self.settings = settings
        self.count = count
        self.metrics_dir = tempfile.mkdtemp(prefix="execbox-runner-metrics-")
        self.draining = False
        self.status = 0
        self.shards: list[trio.Process | None] = [None] * count

    async def run(self) -> int:
        reaper.become_subreaper()  # a dead shard's zygote and workers come back to us, to reap
        with reserve_port(self.settings.host, self.settings.port) as reserved:
            port = reserved.getsockname()[1]
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(reaper.reap_on_exits, self._owned)
                        urls = [await nursery.start(self._keep, index, port) for index in range(self.count)]
                        reserved.close()
                        print(listening_line(urls[0]), flush=True)
                        log.info("serving %s with %d daemon processes", urls[0], self.count)
                        async for signum in signals:
                            # Shards drain on the first signal and stop at once on the second: forward both.
                            name = signal.Signals(signum).name
                            if self.draining:
                                log.warning("received %s again while draining: stopping at once", name)
                            else:
                                log.info("received %s, draining (a second signal stops at once)", name)
                                nursery.start_soon(self._wait_all, nursery.cancel_scope)
                            self.draining = True  # before forwarding: a shard that exits is not restarted
                            self._forward(signum)
                finally:
                    shutil.rmtree(self.metrics_dir, ignore_errors=True)
        return self.status

    def _owned(self) -> list[trio.Process]:
        return [shard for shard in self.shards if shard is not None]

    def _forward(self, signum: int) -> None:
        for shard in self.shards:
            if shard is not None and shard.returncode is None:
                shard.send_signal(signum)

    async def _wait_all(self, scope: trio.CancelScope) -> None:
        for shard in self.shards:
            if shard is not None:
                await shard.wait()
        scope.cancel()

    async def _keep(self, index: int, port: int, *, task_status: trio.TaskStatus[str]) -> None:
        """Run shard ``index``; restart it if it dies while we are not draining."""
        first = True
        while True:
            url = await self._start(index, port)
            if first:
                task_status.started(url)
                first = False
            shard = self.shards[index]
            assert shard is not None
            status = await shard.wait()
            with contextlib.suppress(OSError):  # its live state is no longer live
                os.unlink(os.path.join(self.metrics_dir, live_state_file(shard.pid)))
            if self.draining:  # the CLI's statuses: 0 only if every shard drained cleanly
                self.status = max(self.status, 1 if status else 0)
                return
            log.error("daemon process %d exited with status %d; restarting it", shard.pid, status)
            await trio.sleep(RESTART_PAUSE_S)

    async def _start(self, index: int, port: int) -> str:
        env = {**os.environ, SHARD_ENV: f"{index}/{self.count}", MULTIPROCESS_ENV: self.metrics_dir}
        argv = [sys.executable, "-m", "execbox_runner", *self.argv, *shard_arguments(self.settings, self.count, port)]
        # Its own session: a terminal's Ctrl-C reaches the supervisor only, which forwards it once.
        process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, env=env, start_new_session=True)
        self.shards[index] = process
        assert process.stdout is not None
        line = b""
        with trio.fail_after(STARTUP_TIMEOUT_S):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(1)
                if not chunk:
                    raise OSError(f"daemon process {index} exited before listening")
                line += chunk
        await process.stdout.aclose()
        return line.decode().strip().rsplit(" ", 1)[-1]
