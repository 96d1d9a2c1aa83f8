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

Usage (by the pool only): ``python -m execbox_runner.worker FD``
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import sys
import threading
from typing import Final

from . import ipc
from .guest import GuestRun, Runtime, fresh_runtime
from .normalize import normalize

POKE_INTERVAL_S: Final = 0.001
POKE_ATTEMPTS: Final = 2000  # keep interrupting for up to ~2 s, until the abort is taken
# Two threads share the GIL; the default 5 ms switch interval would eat the abort grace.
SWITCH_INTERVAL_S: Final = 0.0002


class Worker:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbox: queue.SimpleQueue[ipc.ToWorker | None] = queue.SimpleQueue()
        self.guest: GuestRun | None = None

    def serve(self) -> None:
        """Run executions until the channel closes or an execution asks for recycling."""
        normalize("0")  # load the parser before the first request
        threading.Thread(target=self._read, name="channel-reader", daemon=True).start()
        self.sock.sendall(ipc.frame(ipc.Ready()))
        while True:
            # Set up the next runtime while idle, off the request's path.
            runtime: Runtime = fresh_runtime()
            message = self.inbox.get()
            while message is not None and not isinstance(message, ipc.Run):
                message = self.inbox.get()  # a late Settle/Abort for an execution that already finished
            if message is None:
                return
            self.guest = GuestRun(message, runtime)
            finished = self._execute(self.guest)
            self.guest = None
            if finished.recycle:
                return

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
                message = ipc.recv_to_worker(self.sock)
                self.inbox.put(message)
                guest = self.guest
                if isinstance(message, ipc.Abort) and guest is not None:
                    for _ in range(POKE_ATTEMPTS):
                        if not guest.interrupt() or guest.abort_taken.wait(POKE_INTERVAL_S):
                            break
        except (EOFError, OSError):
            self.inbox.put(None)


def main(argv: list[str]) -> int:
    # The daemon owns signals; a Ctrl-C in the terminal must not kill workers first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    fd = int(argv[1])
    with socket.socket(fileno=fd) as sock:
        try:
            Worker(sock).serve()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass
    # Skip interpreter teardown: there is nothing to flush, and it costs time.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
