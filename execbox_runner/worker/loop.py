"""The worker process: runs guest executions, one at a time, for the daemon.

Guest JavaScript never runs in the daemon. A worker is started by the pool
with one end of a socketpair, loads everything heavy up front (QuickJS, the
parser) and says ``Ready``; then it runs ``Run`` messages one after another,
each in a fresh QuickJS runtime, until its channel closes. It exits after an
execution that asks to be recycled (timeout, out of memory), so the pool can
replace it with a clean process.

A reader thread owns the channel's receiving side: when an ``Abort`` arrives
while guest code is running, it interrupts that code at once (see
``native.py``), so a spinning guest still hands over its logs.

Before saying ``Ready`` the worker confines itself (``sandbox.py``): from then
on the kernel refuses it files, sockets, processes and the network.

Usage (by the zygote, which calls ``run``; standalone only in tests): ``python -m execbox_runner.worker.loop FD [--no-sandbox]
[--max-memory BYTES] [--max-timeout SECONDS] [--max-output BYTES]``
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import sys
import threading
from typing import Final

from ..protocol import ipc
from . import sandbox
from .guest import GuestRun, Runtime, fresh_runtime
from .normalize import normalize

POKE_INTERVAL_S: Final = 0.001
POKE_ATTEMPTS: Final = 2000  # keep interrupting for up to ~2 s, until the abort is taken
# Two threads share the GIL; the default 5 ms switch interval would eat the abort grace.
SWITCH_INTERVAL_S: Final = 0.0002


# CPU time a worker may use beyond an execution's own budget before the kernel stops it.
CPU_SLACK_S: Final = 5.0


class Worker:
    def __init__(self, sock: socket.socket, limits: sandbox.Limits | None, *, probe: bool = False) -> None:
        self.sock = sock
        self.probe = probe  # test hook: report what the confined worker can do, then exit
        self.limits = limits  # None: not confined (tests of the worker loop itself)
        self.inbox: queue.SimpleQueue[ipc.ToWorker | None] = queue.SimpleQueue()
        self.guest: GuestRun | None = None

    def serve(self, runtime: Runtime | None = None) -> None:
        """Run executions until the channel closes or an execution asks for recycling.

        ``runtime`` is the first execution's, when the zygote prepared it before forking.
        """
        normalize("0")  # load the parser before the first request
        # (fresh_runtime also compiles the bootstrap, while files can still be read.)
        runtime = runtime or fresh_runtime()
        threading.Thread(target=self._read, name="channel-reader", daemon=True).start()
        missing = sandbox.confine(self.sock.fileno(), self.limits) if self.limits is not None else ["all"]
        if self.probe:
            self.sock.sendall(ipc.frame(ipc.Probed(outcomes=sandbox.probe(), missing=missing)))
            return
        self.sock.sendall(ipc.frame(ipc.Ready()))
        while True:
            message = self.inbox.get()
            while message is not None and not isinstance(message, ipc.Run):
                message = self.inbox.get()  # a late Settle/Abort for an execution that already finished
            if message is None:
                return
            if self.limits is not None:
                sandbox.set_cpu_backstop(message.budget_s + CPU_SLACK_S)
            self.guest = GuestRun(message, runtime)
            finished = self._execute(self.guest)
            self.guest = None
            if finished.recycle:
                return
            runtime = fresh_runtime()  # the next one, prepared while idle

    def _execute(self, guest: GuestRun) -> ipc.Finished:
        out = guest.start()
        while True:
            if isinstance(out, ipc.Finished):
                self.sock.sendall(ipc.frame(out))
                return out
            if out.calls or out.logs:
                self.sock.sendall(ipc.frame(out))
            message = self.inbox.get()
            if message is None:
                raise EOFError("channel closed")
            if isinstance(message, ipc.Settle):
                out = guest.settle(message)
            elif isinstance(message, ipc.Abort):
                out = guest.abort()
            else:
                raise RuntimeError("Run received while an execution is active")

    def _read(self) -> None:
        try:
            while True:
                message = recv_to_worker(self.sock)
                self.inbox.put(message)
                guest = self.guest
                if isinstance(message, ipc.Abort) and guest is not None:
                    for _ in range(POKE_ATTEMPTS):
                        if not guest.interrupt() or guest.abort_taken.wait(POKE_INTERVAL_S):
                            break
        except (EOFError, OSError):
            self.inbox.put(None)


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Blocking read of exactly ``n`` bytes (worker side); EOFError on a closed channel."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("channel closed")
        got += k
    return bytes(buf)


def recv_to_worker(sock: socket.socket) -> ipc.ToWorker:
    (length,) = ipc.HEADER.unpack(recv_exactly(sock, ipc.HEADER.size))
    return ipc.to_worker_decoder.decode(recv_exactly(sock, length))


def address_space(max_memory: int, max_output: int) -> int:
    """The address-space backstop: what the process maps now, plus room for the
    largest QuickJS heap and the copies of the largest output, plus slack."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    return mapped + 2 * max_memory + 4 * max_output + (256 << 20)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="execbox_runner.worker.loop")
    parser.add_argument("fd", type=int)
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--max-memory", type=int, default=512 << 20)
    parser.add_argument("--max-timeout", type=float, default=300.0)
    parser.add_argument("--max-output", type=int, default=16 << 20)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    return parser


def run(fd: int, args: argparse.Namespace, runtime: Runtime | None = None) -> int:
    """Be a worker on channel ``fd`` until it closes; the process's exit status."""
    # The daemon owns signals; a Ctrl-C in the terminal must not kill workers first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    with socket.socket(fileno=fd) as sock:
        limits = None
        if not args.no_sandbox:
            limits = sandbox.Limits(
                address_space_bytes=address_space(args.max_memory, args.max_output),
                cpu_seconds=int(args.max_timeout + CPU_SLACK_S),
            )
        try:
            Worker(sock, limits, probe=args.probe).serve(runtime)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass
    return 0


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv[1:])
    status = run(args.fd, args)
    # Skip interpreter teardown: there is nothing to flush, and it costs time.
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
