"""Several daemon processes on one port: the network side on every core.

One Python process drives its WebSockets on one core. With ``--processes N``
(default: one per core) ``execbox-runner serve`` becomes a supervisor that
starts N shard daemons. Each binds the same address with ``SO_REUSEPORT``, so
the kernel spreads new connections across them, and each has its own zygote
and workers. The supervisor stays small: it prints the one URL, forwards
SIGTERM/SIGINT (every shard drains, each execution still gets its ``done``;
a second signal is forwarded too, and stops them at once), restarts a shard
that dies (a second later, as often as it dies), and exits 0 when every shard
drained cleanly, else 1. A signal before every shard listens stops those started
(a shard not yet ready stops at once) and starts no other: exit 0, as a lone
daemon's. Each shard also stops if the supervisor dies, even while it starts. A
shard that exits before it first listens (its port taken, say) has said why in
one line: the supervisor stops the others and exits with its status. Shards share a
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
from collections.abc import AsyncIterator
from typing import Final

import trio

from .config import Settings
from .observability.metrics import MULTIPROCESS_ENV, live_state_file
from .pool import reaper
from .startup import listening_line

log = logging.getLogger(__name__)

SHARD_ENV: Final = "EXECBOX_RUNNER_SHARD"  # "INDEX/COUNT", set for shards only
OWNER_ENV: Final = "EXECBOX_RUNNER_OWNER"  # a PID, set by the Python client for the private daemon it starts
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


def parent_to_watch() -> int | None:
    """The process whose death stops this one: a shard's supervisor, or the process that started a
    private daemon (``Runner.local``) and named itself in ``EXECBOX_RUNNER_OWNER``; else ``None``."""
    if is_shard():
        return os.getppid()
    owner = os.environ.get(OWNER_ENV, "")
    return int(owner) if owner.isdigit() else None


async def watch_parent(parent: int) -> None:
    """Drain (by signalling ourselves) once ``parent`` is no longer our parent: it died without
    stopping us (a supervisor killed before it forwarded a signal, a client process killed).

    Polled, not PR_SET_PDEATHSIG: that fires when the parent *thread* exits, and
    trio and the client start processes from worker threads, which come and go.
    """
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
        self.ready = False  # every shard listens, and the URL is printed
        self.stopping: int | None = None  # the signal last forwarded: no shard is started or restarted
        self.forced = False  # a second signal came during a drain
        self.status = 0
        self.shards: list[trio.Process | None] = [None] * count

    async def run(self) -> int:
        """Start the shards, keep them, and stop with them on a signal; the exit status.

        Signals are read from the start, as a lone daemon reads them: one that comes before every
        shard listens is forwarded to those started (each stops at once, or drains if it already
        listens), no other is started, and the supervisor exits 0 once they have exited."""
        reaper.become_subreaper()  # a dead shard's zygote and workers come back to us, to reap
        with (
            reserve_port(self.settings.host, self.settings.port) as reserved,
            trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals,
        ):
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(reaper.reap_on_exits, self._owned)
                    if (owner := parent_to_watch()) is not None:
                        nursery.start_soon(watch_parent, owner)
                    nursery.start_soon(self._forward_signals, signals)
                    await self._serve(reserved)
                    nursery.cancel_scope.cancel()  # every shard has exited
            finally:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)
        return self.status

    async def _forward_signals(self, signals: AsyncIterator[int]) -> None:
        """Shards drain on the first signal and stop at once on the second: forward both."""
        async for signum in signals:
            name = signal.Signals(signum).name
            if self.stopping is not None:
                log.warning("received %s again while draining: stopping at once", name)
                self.forced = self.ready
            elif self.ready:
                log.info("received %s, draining (a second signal stops at once)", name)
            else:
                log.warning("received %s before the daemon was ready: stopping", name)
            self.stopping = signum  # before forwarding: a shard that exits is not restarted
            for shard in self._owned():
                if shard.returncode is None:
                    shard.send_signal(signum)

    async def _serve(self, reserved: socket.socket) -> None:
        """Start the shards one after the other, print the URL once all listen, and follow each
        until it has exited after a signal."""
        port = reserved.getsockname()[1]
        async with trio.open_nursery() as nursery:
            url = ""
            for index in range(self.count):
                if self.stopping is not None:
                    return
                url = await self._start(index, port)
                shard = self.shards[index]
                assert shard is not None
                if not url and self.stopping is None:
                    await self._failed_start(index, shard)
                    return
                nursery.start_soon(self._keep, index, port)
                if not url:  # stopped by a signal as it started: start no other
                    return
            reserved.close()
            self.ready = True
            print(listening_line(url), flush=True)
            log.info("serving %s with %d daemon processes", url, self.count)

    async def _failed_start(self, index: int, shard: trio.Process) -> None:
        """Shard ``index`` exited before it listened: stop those started, and exit with its status.
        It said why in one line (the CLI's rule), unless a signal ended it: then we do."""
        status = await shard.wait()
        if status < 0:
            name = signal.Signals(-status).name
            print(f"execbox-runner: daemon process {index} died of {name} before listening", file=sys.stderr)
        self.status = status if status > 0 else 1
        self.stopping = signal.SIGTERM
        for started in self._owned():
            if started.returncode is None:
                started.send_signal(signal.SIGTERM)

    def _stopped(self) -> bool:
        return self.stopping is not None

    def _owned(self) -> list[trio.Process]:
        return [shard for shard in self.shards if shard is not None]

    async def _keep(self, index: int, port: int) -> None:
        """Follow shard ``index``; restart it if it dies before a signal, as often as it dies."""
        while True:
            shard = self.shards[index]
            assert shard is not None
            status = await shard.wait()
            with contextlib.suppress(OSError):  # its live state is no longer live
                os.unlink(os.path.join(self.metrics_dir, live_state_file(shard.pid)))
            if self.stopping is not None:  # the CLI's statuses: 0 only if every shard drained cleanly
                self.status = max(self.status, 1 if self.forced or (status and self.ready) else 0)
                return
            log.error("daemon process %d exited with status %d; restarting it", shard.pid, status)
            await trio.sleep(RESTART_PAUSE_S)
            if self._stopped():  # a signal came during the pause
                return
            await self._start(index, port)

    async def _start(self, index: int, port: int) -> str:
        """Start shard ``index`` and wait for its listening line: its URL, or "" if it exited first."""
        env = {**os.environ, SHARD_ENV: f"{index}/{self.count}", MULTIPROCESS_ENV: self.metrics_dir}
        argv = [sys.executable, "-m", "execbox_runner", *self.argv, *shard_arguments(self.settings, self.count, port)]
        # Its own session: a terminal's Ctrl-C reaches the supervisor only, which forwards it once.
        process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, env=env, start_new_session=True)
        self.shards[index] = process
        if self.stopping is not None:  # a signal came while it was being started
            process.send_signal(self.stopping)
        assert process.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            chunk = await process.stdout.receive_some(1)
            if not chunk:
                await process.stdout.aclose()
                return ""
            line += chunk
        await process.stdout.aclose()
        return line.decode().strip().rsplit(" ", 1)[-1]
