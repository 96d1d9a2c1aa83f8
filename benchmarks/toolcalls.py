#!/usr/bin/env python3
"""CPU per execution on the tool-call path: 0, 1 and 10 sequential tool calls, and 10 in parallel.

Starts a daemon with default settings, warms it up, waits for its pool to settle, then runs each
workload at each concurrency for ``--duration`` seconds with the raw load client (a fresh
connection per execution, every ``tool_call`` answered at once with its input). Prints, per
workload and concurrency: executions per second, median latency, and the CPU per execution of
the daemon, its workers and the whole tree; then what one tool call adds to an execution
(``(1 tool - 0 tools)``, and ``(10 tools - 1 tool) / 9`` for each further sequential one).
Rounds alternate the workloads' order, so that a drift of the machine's load falls on all alike;
the figures printed are each workload's median over the rounds.

    python benchmarks/toolcalls.py [--rounds 3] [--duration 3] [--concurrency 1,64] [--daemon-arg=...]

It asserts nothing about time; every wait is bounded.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any, Final

from benchkit.processes import start_daemon
from benchkit.procfs import wait_pool_settled
from benchkit.throughput import WARM_UP_S, run_throughput
from benchkit.workload import tool_code

PARALLEL_CODE: Final = (
    "const r = await Promise.all(Array.from({length: 10}, (_, i) => tools.echo({i}))); r.reduce((n, x) => n + x.i, 0)"
)
WORKLOADS: Final = {"0 tools": tool_code(0), "1 tool": tool_code(1), "10 sequential": tool_code(10)}
WORKLOADS["10 parallel"] = PARALLEL_CODE
FIGURES: Final = ("daemon_us_per_exec", "workers_us_per_exec", "daemon_plus_workers_us_per_exec")


def measure(
    url: str, pid: int, concurrency: list[int], duration: float, rounds: int
) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Each workload at each concurrency, ``rounds`` times, the order reversed every other round."""
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    names = list(WORKLOADS)
    for index in range(rounds):
        for name in names if index % 2 == 0 else names[::-1]:
            for level in concurrency:
                result = run_throughput(url, "raw", level, duration, 1, WORKLOADS[name], pid)
                results.setdefault((name, level), []).append(result)
                if result["failures"]:
                    print(f"  {name} c={level}: {result['failures']} failures, {result['failure_examples']}")
    return results


def median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(run[key] for run in runs if run.get(key) is not None))


def report(results: dict[tuple[str, int], list[dict[str, Any]]], concurrency: list[int]) -> None:
    print(
        f"{'workload':<14} {'c':>3} {'exec/s':>8} {'median ms':>9} {'daemon':>8} {'workers':>8} {'tree':>8}  (us/exec)"
    )
    for (name, level), runs in results.items():
        daemon, workers, tree = (median(runs, key) for key in FIGURES)
        rate, latency = median(runs, "executions_per_s"), median(runs, "latency_median_ms")
        print(f"{name:<14} {level:>3} {rate:8.0f} {latency:9.2f} {daemon:8.0f} {workers:8.0f} {tree:8.0f}")
    print("what a tool call adds to the tree (us):")
    for level in concurrency:
        zero, one, ten = (median(results[(name, level)], FIGURES[2]) for name in ("0 tools", "1 tool", "10 sequential"))
        parallel = median(results[("10 parallel", level)], FIGURES[2])
        print(
            f"  c={level:<3} first {one - zero:6.0f}   each further sequential {(ten - one) / 9:6.0f}"
            f"   each of 10 parallel {(parallel - zero) / 10:6.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per workload and concurrency")
    parser.add_argument("--concurrency", default="1,64", help="comma-separated levels")
    parser.add_argument("--daemon-arg", action="append", default=[], help="passed to `serve` (repeatable)")
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    daemon = start_daemon(extra_args=args.daemon_arg)
    try:
        pid = daemon.process.pid
        run_throughput(daemon.url, "raw", max(levels), WARM_UP_S, 1, WORKLOADS["1 tool"], pid)
        wait_pool_settled(pid)
        report(measure(daemon.url, pid, levels, args.duration, args.rounds), levels)
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
