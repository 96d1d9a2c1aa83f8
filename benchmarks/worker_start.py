"""Where a worker's life goes: from the fork request to ``Ready``, and from its channel's close to its exit.

The ``hardened`` profile starts a worker for every execution, so this is its cost per execution
beyond ``standard``'s. Starts the zygote (``python -m execbox_runner.worker.zygote``) as the daemon
does, for each variant in turn: the hardened worker (one runner thread), the standard one
(``--threads 16``), and each without confinement (``--no-sandbox``). For ``--workers`` workers
one after another it times the fork request to the zygote's ``FORKED``, ``FORKED`` to the
worker's ``Ready``, and closing its channel to the zygote's ``EXITED`` report; and it reads the
CPU the zygote and its reaped workers used, per worker, and their minor page faults: most pages
a worker writes are still the zygote's, each copied at its first write (Python's reference counts
write to every object used), and so are the zygote's own after each fork. The differences between
variants are what confinement and runner threads cost.

    python benchmarks/worker_start.py [--workers 100]

Every wait is bounded; the zygotes are stopped (their control channel closed) at the end.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from statistics import median

from benchkit.procfs import minor_faults, tree_cpu_seconds

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
    kind, pid, status, _cpu_us = ipc.ZYGOTE_REPORT.unpack(control.recv(ipc.ZYGOTE_REPORT.size, socket.MSG_WAITALL))
    return kind, pid, status


@dataclass
class Lives:
    """Each worker's fork, start and exit (ms); per worker, the CPU (ms) and the minor page faults
    of the zygote and its workers."""

    forks: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    exits: list[float] = field(default_factory=list)
    cpu_ms: float = 0.0
    zygote_faults: float = 0.0
    worker_faults: float = 0.0


def lives(arguments: list[str], workers: int) -> Lives:
    """``workers`` workers one after another, after a first one as a warm-up."""
    control, theirs = socket.socketpair()
    control.settimeout(IO_TIMEOUT_S)
    command = [sys.executable, "-m", "execbox_runner.worker.zygote", str(theirs.fileno()), *arguments]
    zygote = subprocess.Popen(command, pass_fds=[theirs.fileno()])
    theirs.close()
    measured = Lives()
    try:
        for index in range(workers + 1):
            if index == 1:
                cpu_before, faults_before = zygote_cpu_s(zygote.pid), minor_faults(zygote.pid)
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
                measured.forks.append((forked - asked) * 1000)
                measured.starts.append((ready - forked) * 1000)
                measured.exits.append((gone - ready) * 1000)
        measured.cpu_ms = (zygote_cpu_s(zygote.pid) - cpu_before) / workers * 1000
        zygote_faults, worker_faults = minor_faults(zygote.pid)
        measured.zygote_faults = (zygote_faults - faults_before[0]) / workers
        measured.worker_faults = (worker_faults - faults_before[1]) / workers
        return measured
    finally:
        control.close()
        zygote.wait(timeout=IO_TIMEOUT_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=100)
    args = parser.parse_args()
    print(f"{args.workers} workers one after another, median ms; per worker, the CPU (ms) and minor page faults")
    print(f"  {'variant':26} {'fork':>6} {'to Ready':>9} {'exit':>6} {'CPU':>6} {'faults: zygote':>15} {'worker':>7}")
    for name, arguments in VARIANTS.items():
        m = lives(arguments, args.workers)
        print(
            f"  {name:26} {median(m.forks):6.2f} {median(m.starts):9.2f} {median(m.exits):6.2f} {m.cpu_ms:6.2f}"
            f" {m.zygote_faults:15.0f} {m.worker_faults:7.0f}"
        )


if __name__ == "__main__":
    main()
