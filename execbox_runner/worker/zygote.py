"""The zygote: a pre-initialised process that forks workers on request.

Starting a Python interpreter and importing QuickJS, the parser and the rest
costs ~100 ms of CPU; forking a process that already has all of that (and the
compiled bootstrap) costs about a millisecond. The zygote never runs guest
code: it only forks. Each child closes the zygote's control channel and
becomes a worker (``loop.Worker``), confining itself before it says Ready.

Protocol on the control socket (a Unix socketpair with the daemon): the daemon
sends one byte carrying the new worker's channel as an SCM_RIGHTS descriptor;
the zygote forks and answers with the child's PID (4 bytes, big-endian).
The zygote reaps its children (so their CPU time is accounted to it); the
daemon follows each one through a pidfd, which also makes killing it safe
against PID reuse.

It imports only what workers need (no trio, no websockets): the smaller the
process, the cheaper each fork. The daemon's side is ``pool.ZygoteClient``.

Usage (by the pool only): ``python -m execbox_runner.worker.zygote FD [worker options]``
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys

from ..protocol import ipc
from . import loop, sandbox
from .guest import fresh_runtime
from .normalize import normalize


def serve(control: socket.socket, args: argparse.Namespace) -> None:
    """Fork a worker for each request until the daemon closes the control socket."""
    if not args.no_sandbox:
        sandbox.isolate()  # the network namespace and user every worker shares
    normalize("0")
    # Each child inherits its own copy of this runtime, fresh and never used here.
    runtime = fresh_runtime()
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
            os._exit(loop.run(channel, args, runtime))
        os.close(channel)
        control.sendall(ipc.FORKED.pack(pid))


def _reap_children(signum: int, frame: object) -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str]) -> int:
    args = loop.parser().parse_args(argv[1:])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon owns signals
    with socket.socket(fileno=args.fd) as control:
        serve(control, args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
