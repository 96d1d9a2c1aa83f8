"""The worker process: runs guest executions, one at a time, for the daemon.

Guest JavaScript never runs in the daemon. A worker is started by the pool
with one end of a socketpair, loads everything heavy up front (QuickJS, the
parser) and says ``Ready``; then it runs ``Run`` messages one after another,
each in a fresh QuickJS runtime, until its channel closes. It exits after an
execution that asks to be recycled (timeout, out of memory), so the pool can
replace it with a clean process.

Usage (by the pool only): ``python -m execbox_runner.worker FD``
"""

from __future__ import annotations

import os
import signal
import socket
import sys

from . import ipc
from .guest import GuestRun
from .normalize import normalize


def serve(sock: socket.socket) -> None:
    """Run executions until the channel closes or an execution asks for recycling."""
    normalize("0")  # load the parser before the first request
    sock.sendall(ipc.frame(ipc.Ready()))
    while True:
        try:
            message = ipc.recv_to_worker(sock)
        except EOFError:
            return
        if not isinstance(message, ipc.Run):
            continue  # a late Settle/Abort for an execution that already finished
        if execute(sock, message).recycle:
            return


def execute(sock: socket.socket, run: ipc.Run) -> ipc.Finished:
    guest = GuestRun(run)
    out = guest.start()
    while True:
        if isinstance(out, ipc.Finished):
            sock.sendall(ipc.frame(out))
            return out
        if out.calls or out.logs:
            sock.sendall(ipc.frame(out))
        message = ipc.recv_to_worker(sock)
        if isinstance(message, ipc.Settle):
            out = guest.settle(message)
        elif isinstance(message, ipc.Abort):
            out = guest.abort()
        else:
            raise RuntimeError("Run received while an execution is active")


def main(argv: list[str]) -> int:
    # The daemon owns signals; a Ctrl-C in the terminal must not kill workers first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = int(argv[1])
    with socket.socket(fileno=fd) as sock:
        try:
            serve(sock)
        except (EOFError, BrokenPipeError, ConnectionResetError):
            pass
    # Skip interpreter teardown: there is nothing to flush, and it costs time.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
