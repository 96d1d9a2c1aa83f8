#!/usr/bin/env python3
"""CPU per reactor pass: the daemon's ``Reactor`` waiting through trio each time, or on its epoll.

A forked feeder writes a byte to a socketpair every ``--gap-us`` microseconds
(a busy daemon's sockets become ready about that often) for ``--seconds``; the
reactor's handler reads it. Measured alternately, ``--rounds`` times: the
reactor as the daemon runs it (after a pass, it waits on its own epoll while
sockets keep becoming ready: ``BUSY_WAIT_S``, ``PASSES_PER_TURN``, ``TRIO_TURN_S``), and with
``TRIO_TURN_S`` 0 (every pass through trio's scheduler, as before 2026-11-26).
Prints each side's passes and CPU per pass (this process's user+system time,
the feeder's not counted) and their ratio.

    python benchmarks/reactor_pass.py [--gap-us 200] [--seconds 2] [--rounds 3]

It asserts nothing about time; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import time

import trio

from execbox_runner.daemon.net import reactor as reactor_module
from execbox_runner.daemon.net.reactor import READ, Reactor


def feed(sock: socket.socket, gap_s: float, seconds: float) -> None:
    """(The forked child.) A byte every ``gap_s`` (spinning: a sleep would be far coarser), then close."""
    end = time.monotonic() + seconds
    while (now := time.monotonic()) < end:
        sock.send(b"x")
        while time.monotonic() < now + gap_s:
            pass
    sock.close()


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def serve(sock: socket.socket, timeout_s: float) -> int:
    """Run a reactor on ``sock`` until the feeder closes it; how many passes read from it."""
    reactor = Reactor()
    reads = 0
    closed = trio.Event()

    def ready(_mask: int) -> None:
        nonlocal reads
        if sock.recv(4096):
            reads += 1
        else:
            reactor.unregister(sock.fileno())
            closed.set()

    reactor.register(sock.fileno(), READ, ready)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reactor.run)
        with trio.fail_after(timeout_s):
            await closed.wait()
        nursery.cancel_scope.cancel()
    reactor.close()
    return reads


def measure(turn_s: float, gap_s: float, seconds: float) -> tuple[int, float]:
    """Passes and CPU microseconds per pass with ``TRIO_TURN_S`` set to ``turn_s``."""
    reactor_module.TRIO_TURN_S = turn_s  # type: ignore[misc]  # the module's Final, set for this run
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        ours.close()
        feed(theirs, gap_s, seconds)
        os._exit(0)
    theirs.close()
    ours.setblocking(False)
    before = cpu_s()
    try:
        passes = trio.run(serve, ours, seconds + 10)
    finally:
        os.waitpid(pid, 0)
        ours.close()
    return passes, (cpu_s() - before) / max(passes, 1) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--gap-us", type=float, default=200.0, help="between the feeder's bytes")
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    default = reactor_module.TRIO_TURN_S
    print(f"a byte every {args.gap_us:g} us for {args.seconds:g} s; CPU of the reactor's process per pass")
    ratios = []
    for index in range(args.rounds):
        direct = measure(default, args.gap_us / 1e6, args.seconds)
        through = measure(0.0, args.gap_us / 1e6, args.seconds)
        ratios.append(direct[1] / through[1])
        print(
            f"  round {index + 1}: waiting on its epoll {direct[1]:5.1f} us ({direct[0]} passes); "
            f"through trio every pass {through[1]:5.1f} us ({through[0]} passes); ratio {ratios[-1]:.2f}"
        )
    print(f"ratio range {min(ratios):.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    main()
