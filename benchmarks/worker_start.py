"""Where a worker's life goes: from the fork request to ``Ready``, and from its channel's close to its exit.

The ``hardened`` profile starts a worker for every execution, so this is its cost per execution
beyond ``standard``'s. Starts the zygote (``python -m execbox_runner.worker.zygote``) as the daemon
does, for each variant in turn: the hardened worker (one runner thread), the standard one
(``--threads 16``), and each without confinement (``--no-sandbox``). For ``--workers`` workers
one after another it times the fork request to the zygote's ``FORKED``, ``FORKED`` to the
worker's ``Ready``, and closing its channel to the zygote's ``EXITED`` report; and it reads the
CPU the zygote and its reaped workers used, per worker. The differences between variants are
what confinement and runner threads cost.

    python benchmarks/worker_start.py [--workers 100]

Every wait is bounded; the zygotes are stopped (their control channel closed) at the end.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from statistics import median

from benchkit.procfs import tree_cpu_seconds

from execbox_runner.protocol import ipc

VARIANTS = {
    "hardened (1 thread)": ["--threads", "1"],
    "hardened, no confinement": ["--threads", "1", "--no-sandbox"],
    "standard (16 threads)": ["--threads", "16"],
    "standard, no confinement": ["--threads", "16", "--no-sandbox"],
}
IO_TIMEOUT_S = 30.0


def zygote_cpu_s(pid: int) -> float:
    """CPU of the zygote and of its workers, live or reaped."""
    own, workers, _ = tree_cpu_seconds(pid)
    return own + workers


def report(control: socket.socket) -> tuple[bytes, int, int]:
    kind, pid, status = ipc.ZYGOTE_REPORT.unpack(control.recv(ipc.ZYGOTE_REPORT.size, socket.MSG_WAITALL))
    return kind, pid, status


def lives(arguments: list[str], workers: int) -> tuple[list[float], list[float], list[float], float]:
    """Milliseconds of each worker's fork, start and exit; the CPU per worker, in ms."""
    control, theirs = socket.socketpair()
    control.settimeout(IO_TIMEOUT_S)
    command = [sys.executable, "-m", "execbox_runner.worker.zygote", str(theirs.fileno()), *arguments]
    zygote = subprocess.Popen(command, pass_fds=[theirs.fileno()])
    theirs.close()
    forks, starts, exits = [], [], []
    try:
        for index in range(workers + 1):  # the first is a warm-up
            if index == 1:
                cpu_before = zygote_cpu_s(zygote.pid)
            ours, child = socket.socketpair()
            ours.settimeout(IO_TIMEOUT_S)
            asked = time.perf_counter()
            socket.send_fds(control, [b"f"], [child.fileno()])
            child.close()
            assert report(control)[0] == ipc.FORKED
            forked = time.perf_counter()
            frames = ipc.Unframer()
            while (body := frames.next()) is None:
                frames.feed(ours.recv(65536))
            assert isinstance(ipc.from_worker_decoder.decode(body)[1], ipc.Ready)
            ready = time.perf_counter()
            ours.close()
            assert report(control)[0] == ipc.EXITED
            gone = time.perf_counter()
            if index:
                forks.append((forked - asked) * 1000)
                starts.append((ready - forked) * 1000)
                exits.append((gone - ready) * 1000)
        return forks, starts, exits, (zygote_cpu_s(zygote.pid) - cpu_before) / workers * 1000
    finally:
        control.close()
        zygote.wait(timeout=IO_TIMEOUT_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=100)
    args = parser.parse_args()
    print(f"{args.workers} workers one after another, median ms (CPU: the zygote and its workers, per worker)")
    print(f"  {'variant':26} {'fork':>6} {'to Ready':>9} {'exit':>6} {'CPU':>6}")
    for name, arguments in VARIANTS.items():
        forks, starts, exits, cpu = lives(arguments, args.workers)
        print(f"  {name:26} {median(forks):6.2f} {median(starts):9.2f} {median(exits):6.2f} {cpu:6.2f}")


if __name__ == "__main__":
    main()
