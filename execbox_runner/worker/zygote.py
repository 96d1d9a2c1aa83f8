"""The zygote: a pre-initialised process that forks workers on request.

Starting a Python interpreter and importing QuickJS, the parser and the rest
costs ~100 ms of CPU; forking a process that already has all of that (and the
compiled bootstrap) costs about a millisecond. The zygote never runs guest
code: it only forks. Each child closes the zygote's control channel and
becomes a worker (``loop.Worker``), confining itself before it says Ready.

Protocol on the control socket (a Unix socketpair with the daemon): the daemon
sends one byte carrying the new worker's channel as an SCM_RIGHTS descriptor;
the zygote forks and answers ``FORKED`` with the child's PID
(``ipc.ZYGOTE_REPORT``). The zygote reaps its children (so their CPU time is
accounted to it) and reports each one's wait status and CPU time (``EXITED``): only the
parent can learn it, and it is how the daemon tells a crash (SIGSEGV, the
OOM killer's SIGKILL) from a worker it stopped itself. A worker's CPU-time
backstop (RLIMIT_CPU, soft and hard alike) kills it with SIGKILL too: the
zygote, which knows the limit and learns the CPU time its child used, reports
that case as ``CPU_LIMIT``. Reaping is
done by the main loop, woken by SIGCHLD through a wakeup pipe, so a report
never interleaves with an answer and a worker's ``FORKED`` always precedes
its ``EXITED``. The daemon follows each worker through a pidfd, which also
makes killing it safe against PID reuse.

It imports only what workers need (no trio, no websockets): the smaller the
process, the cheaper each fork. The daemon's side is ``pool.ZygoteClient``.

Usage (by the pool only): ``python -m execbox_runner.worker.zygote FD [worker options]``
"""

from __future__ import annotations

import argparse
import gc
import os
import select
import signal
import socket
import sys

from ..protocol import ipc
from . import loop, sandbox
from .normalize import normalize
from .runtime import fresh_runtime


def serve(control: socket.socket, args: argparse.Namespace) -> None:
    """Fork a worker for each request, and report each one that exits, until the daemon goes away
    or shuts its side of ``control`` to retire this zygote (``zygote_client``): the requests sent
    before are answered first, and the workers still alive then are reaped by the daemon."""
    if not args.no_sandbox:
        sandbox.isolate()  # the network namespace and user every worker shares
    normalize("0")
    # Each child inherits its own copy of this runtime, fresh and never used here.
    runtime = fresh_runtime()
    # What exists now lives as long as the zygote: a collection in a child would touch all of it,
    # copying every page the child shares with the zygote.
    gc.freeze()
    wakeup, wakeup_in = os.pipe()
    os.set_blocking(wakeup, False)
    os.set_blocking(wakeup_in, False)
    signal.set_wakeup_fd(wakeup_in, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler, so SIGCHLD reaches the wakeup pipe
    poller = select.poll()
    poller.register(control, select.POLLIN)
    poller.register(wakeup, select.POLLIN)
    while True:
        try:
            ready = {fd for fd, _ in poller.poll()}
            if wakeup in ready:
                os.read(wakeup, 4096)
                _report_exits(control, None if args.no_sandbox else args.cpu_seconds)
            if control.fileno() not in ready:
                continue
            _, fds, _, _ = socket.recv_fds(control, 1, 1)
        except OSError:
            return  # the daemon went away
        if not fds:
            return  # the daemon closed the control socket
        channel = fds[0]
        mapped = loop.mapped_bytes()  # the child's too, as it starts: read here, where it is cheap
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            control.close()
            os.close(wakeup)
            os.close(wakeup_in)
            os._exit(loop.run(channel, args, runtime, mapped))
        os.close(channel)
        try:
            control.sendall(ipc.ZYGOTE_REPORT.pack(ipc.FORKED, pid, 0, 0))
        except OSError:
            return


def _report_exits(control: socket.socket, cpu_limit_s: float | None) -> None:
    """Reap every child that has exited and tell the daemon how each one ended; ``cpu_limit_s`` is
    the CPU time after which the workers' backstop kills them (None: they have none)."""
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        spent_s = usage.ru_utime + usage.ru_stime
        at_limit = (
            cpu_limit_s is not None
            and os.WIFSIGNALED(status)
            and os.WTERMSIG(status) == signal.SIGKILL
            and spent_s >= cpu_limit_s
        )
        kind = ipc.CPU_LIMIT if at_limit else ipc.EXITED
        control.sendall(ipc.ZYGOTE_REPORT.pack(kind, pid, status, round(spent_s * 1e6)))


def main(argv: list[str]) -> int:
    args = loop.parser().parse_args(argv[1:])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon owns signals
    with socket.socket(fileno=args.fd) as control:
        serve(control, args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
