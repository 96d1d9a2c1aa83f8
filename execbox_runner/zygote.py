"""The zygote: a pre-initialised process that forks workers on request.

Starting a Python interpreter and importing QuickJS, the parser and the rest
costs ~100 ms of CPU; forking a process that already has all of that (and the
compiled bootstrap) costs about a millisecond. The zygote never runs guest
code: it only forks. Each child closes the zygote's control channel and
becomes a worker (``worker.Worker``), confining itself before it says Ready.

Protocol on the control socket (a Unix socketpair with the daemon): the daemon
sends one byte carrying the new worker's channel as an SCM_RIGHTS descriptor;
the zygote forks and answers with the child's PID (4 bytes, big-endian).
The zygote reaps its children (so their CPU time is accounted to it); the
daemon follows each one through a pidfd, which also makes killing it safe
against PID reuse.

Usage (by the pool only): ``python -m execbox_runner.zygote FD [worker options]``
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import subprocess
import sys
from typing import Final

import trio

from . import worker
from .guest import fresh_runtime
from .normalize import normalize

PID: Final = struct.Struct(">I")


def serve(control: socket.socket, args: argparse.Namespace) -> None:
    """Fork a worker for each request until the daemon closes the control socket."""
    normalize("0")
    fresh_runtime()  # compiles the bootstrap once, for every child to inherit
    signal.signal(signal.SIGCHLD, _reap_children)
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            return
        if not fds:
            return  # the daemon went away
        channel = fds[0]
        pid = os.fork()
        if pid == 0:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os._exit(worker.run(channel, args))
        os.close(channel)
        control.sendall(PID.pack(pid))


def _reap_children(signum: int, frame: object) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> int:
    args = worker.parser().parse_args(argv[1:])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon owns signals
    with socket.socket(fileno=args.fd) as control:
        serve(control, args)
    return 0


class ZygoteClient:
    """The daemon's side: start the zygote, ask it for workers."""

    def __init__(self, worker_args: list[str]) -> None:
        self.worker_args = worker_args
        self.process: trio.Process | None = None
        self._control: trio.socket.SocketType | None = None
        self._lock = trio.Lock()

    async def start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "execbox_runner.zygote", str(child.fileno()), *self.worker_args],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                # One malloc arena: fewer address-space reservations under the workers' RLIMIT_AS.
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "MALLOC_ARENA_MAX": "1"},
            )
        finally:
            child.close()
        self._control = trio.socket.from_stdlib_socket(parent)

    async def fork(self) -> tuple[int, socket.socket]:
        """A new worker: its PID and the daemon's end of its channel."""
        async with self._lock:
            if self._control is None or self.process is None or self.process.returncode is not None:
                await self.start()
            assert self._control is not None
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                await self._control.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", theirs.fileno()))])
                answer = b""
                while len(answer) < PID.size:
                    chunk = await self._control.recv(PID.size - len(answer))
                    if not chunk:
                        self._control = None
                        raise OSError("the zygote exited")
                    answer += chunk
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            return PID.unpack(answer)[0], ours

    async def aclose(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.process is not None:
            if self.process.returncode is None:
                self.process.kill()
            with trio.CancelScope(shield=True):
                await self.process.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
