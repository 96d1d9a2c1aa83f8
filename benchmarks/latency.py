#!/usr/bin/env python3
"""Latency of one execution on a fresh connection, ``standard`` and ``hardened`` alternated.

Starts a daemon of each profile (default settings otherwise), then in alternated rounds runs
``--runs`` sequential trivial executions (``1+1``) and executions with one tool call against each,
a fresh connection per execution as hosts do it, and prints each profile's median and p95 latency
and hardened / standard at the median. In ``hardened`` every execution takes a fresh worker
process: its latency includes waiting for one when executions come faster than the pool forks them.

    python benchmarks/latency.py [--rounds 3] [--runs 200] [--pause-ms 0]

It asserts nothing about time; every wait is bounded.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchkit.client import run_execution
from benchkit.processes import start_daemon
from benchkit.stats import percentile
from benchkit.workload import tool_code
from websockets.uri import parse_uri

PROFILES = ("standard", "hardened")
WORKLOADS = {"1+1": "1+1", "1 tool": tool_code(1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=200, help="sequential executions per workload, profile and round")
    parser.add_argument("--pause-ms", type=float, default=0.0, help="between executions (a host's think time)")
    args = parser.parse_args()
    daemons = {profile: start_daemon(extra_args=[f"--profile={profile}"]) for profile in PROFILES}
    latencies: dict[tuple[str, str], list[float]] = {}
    failures = 0
    try:
        for index in range(args.rounds):
            for profile in PROFILES if index % 2 == 0 else PROFILES[::-1]:
                uri = parse_uri(daemons[profile].url)
                for name, code in WORKLOADS.items():
                    for run in range(args.runs):
                        seconds, done, error = run_execution(uri, f"{profile}-{index}-{run}", code)
                        if done is None or done.get("ok") is not True:
                            failures += 1
                            print(f"  {profile} {name}: {error or done}")
                        latencies.setdefault((name, profile), []).append(seconds * 1000)
                        time.sleep(args.pause_ms / 1000)
    finally:
        for daemon in daemons.values():
            daemon.stop()
    for name in WORKLOADS:
        medians = {}
        for profile in PROFILES:
            values = latencies[(name, profile)]
            medians[profile] = statistics.median(values)
            print(f"{name:<7} {profile:<9} median {medians[profile]:6.2f} ms  p95 {percentile(values, 0.95):6.2f} ms")
        print(f"{name:<7} hardened / standard at the median: {medians['hardened'] / medians['standard']:.2f}")
    print(f"failures: {failures}")


if __name__ == "__main__":
    main()
