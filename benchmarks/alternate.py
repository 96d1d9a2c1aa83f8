#!/usr/bin/env python3
"""CPU per trivial execution at c=64, this checkout's daemon alternated with another checkout's.

On this shared machine the whole tree's figure at c=64 moves by 20% from run to
run, where a change moves it by a few percent: the only fair comparison is many
runs, alternated, under the same conditions. Each pair starts the daemon of
this checkout and that of ``--other`` (a checkout of another commit, optionally
with ``--other-pythonpath`` first on its path: a QuickJS build made with
``deploy/quickjs/build.py --target``), in turn and in alternating order, with
default settings; warms it up at the concurrency, waits for its pool to settle
and runs the throughput load (``1+1``, a fresh connection per execution) for
``--duration`` seconds. Prints every run (rate; CPU of the daemon's tree, of the
daemon and of its workers per execution), then each side's range and median,
and in how many runs each met ``--target-us`` (issue 9: 600 us); then the pairs one by one: in
how many this side was lower, and the ratio of the two at the median.

    python benchmarks/alternate.py --other PATH [--pairs 5] [--concurrency 64] [--duration 4]

It asserts nothing about time; every wait is bounded.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from benchkit.pairs import alternated, compared
from benchkit.processes import start_daemon
from benchkit.throughput import settled_throughput

THIS: Path = Path(__file__).resolve().parent.parent
FIGURES = ("daemon_plus_workers_us_per_exec", "daemon_us_per_exec", "workers_us_per_exec")


def measure(checkout: Path, pythonpath: str | None, concurrency: int, duration: float) -> dict[str, Any]:
    """One run: a fresh daemon of ``checkout``, warmed up, then the load."""
    daemon = start_daemon(checkout=checkout, pythonpath=pythonpath)
    try:
        return settled_throughput(daemon.url, daemon.process.pid, [concurrency], duration)[concurrency]
    finally:
        daemon.stop()


def line(label: str, result: dict[str, Any]) -> str:
    total, daemon, workers = (result.get(key) for key in FIGURES)
    return (
        f"  {label:<6} {result['executions_per_s']:8.1f} exec/s  tree {total} us/exec"
        f"  (daemon {daemon}, workers {workers})  failures {result['failures']}"
    )


def summary(label: str, results: list[dict[str, Any]], target: float) -> str:
    totals = [r["daemon_plus_workers_us_per_exec"] for r in results if r.get("daemon_plus_workers_us_per_exec")]
    daemons = [r["daemon_us_per_exec"] for r in results if r.get("daemon_us_per_exec")]
    if not totals:
        return f"  {label:<6} no CPU figures"
    met = sum(total <= target for total in totals)
    return (
        f"  {label:<6} tree {min(totals):.0f}-{max(totals):.0f} us, median {statistics.median(totals):.0f}"
        f" (daemon median {statistics.median(daemons):.0f}); <= {target:g} us in {met} of {len(totals)}"
    )


def paired(this: list[dict[str, Any]], other: list[dict[str, Any]]) -> str:
    """The pairs compared one by one: a change of a few percent shows in how many pairs it is lower
    (and by how much at the median) sooner than in the two sides' medians, which the hour moves."""

    def figure(key: str) -> tuple[int, int, float] | None:
        return compared([run.get(key) for run in this], [run.get(key) for run in other])

    tree, daemon = figure(FIGURES[0]), figure(FIGURES[1])
    if tree is None or daemon is None:
        return "  paired: no CPU figures"
    return (
        f"  paired: this lower in {tree[0]} of {tree[1]} pairs (tree), {daemon[0]} of {daemon[1]} (daemon); "
        f"this / other at the median {tree[2]:.3f} (tree), {daemon[2]:.3f} (daemon)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--other", type=Path, required=True, help="a checkout of another commit")
    parser.add_argument("--other-pythonpath", help="first on the other daemon's PYTHONPATH (a QuickJS build)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds of load per run")
    parser.add_argument("--target-us", type=float, default=600.0)
    args = parser.parse_args()
    other = args.other.resolve()
    sides = {"this": (THIS, None), "other": (other, args.other_pythonpath)}
    print(f"c={args.concurrency}, {args.duration:g} s per run; this = {THIS}, other = {other}")

    def run(label: str, _: int) -> dict[str, Any]:
        result = measure(*sides[label], args.concurrency, args.duration)
        print(line(label, result), flush=True)
        return result

    results = alternated(args.pairs, run)
    print("summary:")
    for label, runs in results.items():
        print(summary(label, runs, args.target_us))
    print(paired(results["this"], results["other"]))


if __name__ == "__main__":
    main()
