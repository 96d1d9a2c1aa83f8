"""One worker process alone on its channel, with this process as its daemon (``worker_ramp.py``,
``worker_steady.py``): nothing but the worker's loop is measured.

The worker runs unconfined (``--no-sandbox``) with one malloc arena, as the daemon's pool
starts its zygote (and so every worker).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from execbox_runner.protocol import ipc

from .processes import with_pythonpath
from .procfs import CLK_TCK

WAIT_S = 60.0  # any one wait on the worker


@dataclass
class Usage:
    """A process's CPU seconds (user, system) and context switches (voluntary, involuntary), all threads."""

    user: float
    system: float
    voluntary: int
    involuntary: int

    @classmethod
    def of(cls, pid: int) -> Usage:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        voluntary = involuntary = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            for line in Path(f"/proc/{pid}/task/{task}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary += int(line.split()[1])
        return cls(int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK, voluntary, involuntary)

    def cpu_ms(self, before: Usage, n: int) -> float:
        """CPU milliseconds per execution since ``before``, over ``n`` executions."""
        return (self.user - before.user + self.system - before.system) / n * 1000

    def per(self, before: Usage, n: int) -> str:
        user, system = (self.user - before.user) / n * 1000, (self.system - before.system) / n * 1000
        return (
            f"{user + system:.3f} ms CPU per execution (user {user:.3f}, system {system:.3f}),"
            f" {(self.voluntary - before.voluntary) / n:.1f} + {(self.involuntary - before.involuntary) / n:.1f}"
            " context switches"
        )


class Channel:
    """The daemon's end of the worker's channel."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames = ipc.Unframer()

    def send(self, slot: int, message: ipc.ToWorker) -> None:
        self.sock.sendall(ipc.frame(slot, message))

    def receive(self, timeout: float) -> list[tuple[int, ipc.FromWorker]]:
        """What has arrived, waiting up to ``timeout`` for the first of it ([] if nothing did)."""
        self.sock.settimeout(timeout)
        messages: list[tuple[int, ipc.FromWorker]] = []
        try:
            while not messages:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise EOFError("the worker closed its channel")
                self.frames.feed(data)
                while (body := self.frames.next()) is not None:
                    messages.append(ipc.from_worker_decoder.decode(body))
        except TimeoutError:
            pass
        return messages


@contextmanager
def lone_worker(threads: int, pythonpath: str | None = None) -> Iterator[tuple[subprocess.Popen[bytes], Channel]]:
    """A worker with ``threads`` runner threads, started and ready; its channel closes (and the
    worker ends) on the way out. ``pythonpath``: put this first on its ``PYTHONPATH`` (a QuickJS
    build made with ``deploy/quickjs/build.py --target``)."""
    ours, theirs = socket.socketpair()
    command = [sys.executable, "-m", "execbox_runner.worker.loop", str(theirs.fileno()), "--no-sandbox"]
    environment = {**with_pythonpath(pythonpath), "MALLOC_ARENA_MAX": "1"}
    worker = subprocess.Popen([*command, "--threads", str(threads)], pass_fds=[theirs.fileno()], env=environment)
    theirs.close()
    channel = Channel(ours)
    try:
        ready = channel.receive(WAIT_S)
        if not ready or not isinstance(ready[0][1], ipc.Ready):
            raise RuntimeError(f"the worker did not start: {ready!r}")
        yield worker, channel
    finally:
        ours.close()
        worker.wait(timeout=WAIT_S)
