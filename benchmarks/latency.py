"""Latency of one execution on a fresh connection, with 0, 1 and 10 tool calls, per profile.

Starts a daemon of each profile (``--profiles``, default ``standard`` and ``hardened``; default
settings otherwise), then in alternated rounds runs ``--runs`` sequential executions of each
workload against each with the latency client, a fresh connection per execution as hosts do it
(connect, ``execute``, every ``tool_call`` answered at once with its input, ``done``, closing
handshake, the server's TCP close). Prints each profile's and workload's median and p95, what a
tool call adds at the median (``(10 tools - 1+1) / 10``), and each profile against the first at
the median. In ``hardened`` every execution takes a fresh worker process: its latency includes
waiting for one when executions come faster than the pool forks them.

    python benchmarks/latency.py [--profiles standard,hardened] [--rounds 3] [--runs 200] [--pause-ms 0]
                                 [--other CHECKOUT]

``--other CHECKOUT`` adds, for each profile, that checkout's daemon (``profile/other``), in the
same alternation: this build's latency against another's.

It asserts nothing about time; every wait is bounded.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchkit.client import run_execution
from benchkit.processes import start_daemon
from benchkit.stats import spread
from benchkit.workload import tool_code

WORKLOADS = {"1+1": ("1+1", 2), "1 tool": (tool_code(1), 0), "10 tools": (tool_code(10), 45)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", default="standard,hardened", help="comma-separated, the first is the base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=200, help="sequential executions per workload, profile and round")
    parser.add_argument("--pause-ms", type=float, default=0.0, help="between executions (a host's think time)")
    parser.add_argument("--other", type=Path, help="another checkout of execbox-runner: its daemon beside each profile")
    args = parser.parse_args()
    profiles = args.profiles.split(",")
    sides = {p: (p, None) for p in profiles}  # label: profile, checkout
    if args.other:
        sides |= {f"{p}/other": (p, args.other.resolve()) for p in profiles}
    labels = list(sides)
    daemons = {}
    latencies: dict[tuple[str, str], list[float]] = {(label, name): [] for label in labels for name in WORKLOADS}
    failures = 0
    try:
        for label, (profile, checkout) in sides.items():
            daemons[label] = start_daemon(extra_args=[f"--profile={profile}"], checkout=checkout)
        for index in range(args.rounds):
            for label in labels if index % 2 == 0 else labels[::-1]:
                for name, (code, expect) in WORKLOADS.items():
                    for run in range(args.runs):
                        exec_id = f"{sides[label][0]}-{index}-{run}"
                        seconds, done, error = run_execution(daemons[label].url, exec_id, code)
                        if error or done is None or done.get("ok") is not True or done.get("result") != expect:
                            failures += 1
                            print(f"  {label} {name}: {error or done}")
                        latencies[(label, name)].append(seconds * 1000)
                        time.sleep(args.pause_ms / 1000)
    finally:
        for daemon in daemons.values():
            daemon.stop()
    medians = {key: statistics.median(values) for key, values in latencies.items()}
    width = max(map(len, labels))
    for (label, name), values in latencies.items():
        print(f"{label:<{width}} {name:<8} {spread(values)}")
    for label in labels:
        added = (medians[(label, "10 tools")] - medians[(label, "1+1")]) / 10
        against = " / ".join(f"{medians[(label, name)] / medians[(labels[0], name)]:.2f}" for name in WORKLOADS)
        print(f"{label:<{width}} a tool call adds {added:.3f} ms; against {labels[0]} at the median: {against}")
    print(f"failures: {failures}")


if __name__ == "__main__":
    main()
