"""Does throughput grow with cores? The same load against the daemon pinned to one core, then two.

Starts the daemon with default settings under ``taskset -c 0`` and then under
``taskset -c 0,1`` (``--cpus``), and at each concurrency (``--concurrency``,
default 1,16,64) runs the throughput load client (``1+1``, a fresh connection
per execution, ``--duration`` seconds) after a warm-up. Prints executions per
second, the CPU the whole daemon tree (supervisor, shards, zygotes, workers)
spent per execution, and the ratio between the pinnings. The load client is not
pinned: it runs wherever the kernel puts it, in both runs alike.

    python benchmarks/cores.py [--cpus 0 0,1] [--concurrency 1,16,64] [--duration 4]

It asserts nothing about time.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchkit.processes import start_daemon
from benchkit.throughput import settled_throughput


def measure(cpus: str, levels: list[int], duration: float) -> dict[int, dict[str, Any]]:
    """Throughput per concurrency level of a daemon pinned to ``cpus``."""
    daemon = start_daemon(prefix=["taskset", "-c", cpus])
    try:
        return settled_throughput(daemon.url, daemon.process.pid, levels, duration)
    finally:
        daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cpus", nargs="+", default=["0", "0,1"], help="taskset CPU lists, first one is the base")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--duration", type=float, default=4.0)
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    runs = {cpus: measure(cpus, levels, args.duration) for cpus in args.cpus}
    base = runs[args.cpus[0]]
    print(
        f"throughput ('1+1', fresh connection per execution, {args.duration:g} s per level), daemon pinned with taskset"
    )
    for cpus, results in runs.items():
        for level in levels:
            result = results[level]
            ratio = result["executions_per_s"] / max(base[level]["executions_per_s"], 1e-9)
            print(
                f"  cpus {cpus:<5} c={level:<3} {result['executions_per_s']:8.1f} exec/s  x{ratio:4.2f} of cpus {args.cpus[0]}"
                f"  daemon tree {result.get('daemon_plus_workers_us_per_exec')} us/exec"
                f"  client {result['client_cpu_us_per_exec']} us/exec  failures {result['failures']}"
            )


if __name__ == "__main__":
    main()
