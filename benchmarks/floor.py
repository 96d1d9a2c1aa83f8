"""How far above its stack's floor the runner's CPU per execution is.

Runs the throughput load (``1+1``, a fresh connection per execution, the raw
client) at ``--concurrency`` against two servers in alternated rounds:

* the floor server (``benchkit.floor_server``): the daemon's own socket path
  (the reactor, burst accept, the transport, the handshake fast path, websockets'
  frames) answering each ``execute`` with ``started`` and ``done`` and nothing
  behind them;
* the daemon with default settings, its workers running every guest.

It prints each side's CPU per execution, the daemon's excess over the floor, and
the CPU this process spends making and freeing a bare QuickJS context (the
least a worker does per execution). The floor plus that context is the least
CPU per execution the whole tree can reach on this stack: Python for the network
side (one trio task, websockets' frames), a fresh QuickJS context per execution.

With ``--other PATH`` it alternates this checkout's floor server with that of
another checkout (of the commit to compare with) instead, ``--rounds`` pairs,
and compares them as ``alternate.py`` compares daemons: the measure for a
change to the daemon's socket path, whose CPU per execution moves by a few
percent between runs where the whole tree's moves by twenty.

    python benchmarks/floor.py [--concurrency 64] [--duration 4] [--rounds 3] [--other PATH]

It asserts nothing about time; every wait is bounded.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path
from typing import Any

import quickjs
from benchkit.floor_server import LISTENING
from benchkit.pairs import alternated, summary
from benchkit.processes import popen_module, start_daemon, start_server
from benchkit.procfs import wait_pool_settled
from benchkit.throughput import WARM_UP_S, run_throughput
from benchkit.workload import THROUGHPUT_CODE

CONTEXTS = 2000  # contexts made and freed for the QuickJS figure


def context_us() -> float:
    """CPU microseconds to make a bare QuickJS context (runtime and intrinsics) and free it."""
    quickjs.Context()
    cpu0 = time.process_time()
    for _ in range(CONTEXTS):
        quickjs.Context()
    return (time.process_time() - cpu0) / CONTEXTS * 1e6


def line(label: str, result: dict[str, Any]) -> str:
    """One measurement's figures: rate, failures, CPU per execution of each side, how busy the machine was."""
    failures = f", {result['failures']} failures" if result["failures"] else ""
    return (
        f"  {label:7s} {result['executions_per_s']:7.1f} exec/s{failures}; CPU per execution: server "
        f"{result['daemon_us_per_exec']:4.0f} us, workers {result['workers_us_per_exec']:4.0f} us, "
        f"client {result['client_cpu_us_per_exec']:4.0f} us; machine {result['machine_busy_pct']:.0f}% busy"
    )


def against_daemon(concurrency: int, duration: float, rounds: int) -> None:
    """The floor server and the daemon alternated, then the QuickJS context's CPU beside them."""
    floor = start_server(popen_module("floor_server", stdin=subprocess.PIPE), LISTENING)
    try:
        daemon = start_daemon()
        try:
            floor_pid, daemon_pid = floor.process.pid, daemon.process.pid
            run_throughput(floor.url, "raw", concurrency, WARM_UP_S, 1, THROUGHPUT_CODE, floor_pid)
            run_throughput(daemon.url, "raw", concurrency, WARM_UP_S, 1, THROUGHPUT_CODE, daemon_pid)
            wait_pool_settled(daemon_pid)
            print(f"c={concurrency}, {duration:g} s per measurement, floor and daemon alternated")
            pairs = []
            for index in range(rounds):
                print(f"round {index + 1}")
                bare = run_throughput(floor.url, "raw", concurrency, duration, 1, THROUGHPUT_CODE, floor_pid)
                print(line("floor", bare))
                real = run_throughput(daemon.url, "raw", concurrency, duration, 1, THROUGHPUT_CODE, daemon_pid)
                print(line("daemon", real))
                pairs.append((bare["daemon_us_per_exec"], real["daemon_us_per_exec"], real["workers_us_per_exec"]))
        finally:
            daemon.stop()
    finally:
        floor.stop()

    context = context_us()
    build = f"{getattr(quickjs, 'ARENA_BYTES', 4096)}-byte arenas"
    print(f"a bare QuickJS context made and freed ({build}): {context:.0f} us of CPU")
    for bare, real, workers in pairs:
        print(
            f"  floor {bare:4.0f} us; the daemon {real:4.0f} us, {real - bare:4.0f} us ({real / bare:.2f}x) above it; "
            f"floor + context {bare + context:4.0f} us against the tree's {real + workers:4.0f} us"
        )


def against_other(other: Path, concurrency: int, duration: float, rounds: int) -> None:
    """This checkout's floor server and ``other``'s, alternated in ``rounds`` pairs, and compared."""
    servers = {
        side: start_server(popen_module("floor_server", stdin=subprocess.PIPE, checkout=checkout), LISTENING)
        for side, checkout in (("this", None), ("other", other))
    }
    try:
        for server in servers.values():
            run_throughput(server.url, "raw", concurrency, WARM_UP_S, 1, THROUGHPUT_CODE, server.process.pid)
        print(f"c={concurrency}, {duration:g} s per measurement; this floor server and that of {other}, alternated")

        def run(side: str, _: int) -> float:
            server = servers[side]
            result = run_throughput(server.url, "raw", concurrency, duration, 1, THROUGHPUT_CODE, server.process.pid)
            print(line(side, result), flush=True)
            return float(result["daemon_us_per_exec"])

        results = alternated(rounds, run)
    finally:
        for server in servers.values():
            server.stop()
    print("\n".join(summary(results, digits=1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternated pairs")
    parser.add_argument("--other", type=Path, help="a checkout of another commit: its floor server, not the daemon")
    args = parser.parse_args()
    if args.other is not None:
        against_other(args.other.resolve(), args.concurrency, args.duration, args.rounds)
    else:
        against_daemon(args.concurrency, args.duration, args.rounds)


if __name__ == "__main__":
    main()
