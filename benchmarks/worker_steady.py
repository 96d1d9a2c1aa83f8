"""One worker process fed trivial executions without the daemon: its CPU per execution.

The worker side of ``bench.py``'s throughput at c=64: this process plays the
daemon on the worker's channel and keeps ``--in-flight`` Runs of ``1+1`` in the
worker, sending the next as each finishes, for ``--duration`` seconds after a
one-second warm-up. Prints the rate and the worker's CPU per execution (user,
system) and context switches. With no daemon and no WebSocket client beside it
on the cores, the figure moves by a few percent between runs, where the whole
tree's at c=64 moves by twenty: the measure for a change to the worker alone.

With ``--other-pythonpath DIR --pairs N`` it alternates N pairs of runs, this
environment's QuickJS build against the one in DIR (``deploy/quickjs/build.py
--target DIR`` with the edit to compare left out), and compares them as
``alternate.py`` compares daemons: each side's range and median, and the pairs
one by one (in how many this side was lower, the ratio at the median).

    python benchmarks/worker_steady.py [--in-flight 64] [--duration 3] [--threads 16]
        [--other-pythonpath DIR --pairs N]

It asserts nothing about time; every wait is bounded.
"""

from __future__ import annotations

import argparse
import time

from benchkit.lone_worker import WAIT_S, Channel, Usage, lone_worker
from benchkit.pairs import alternated, summary

from execbox_runner.protocol import ipc

RUN = ipc.Run("1+1", WAIT_S, 64 << 20, 100, 64000, [("tools", ["echo"])], 1 << 24)


def load(channel: Channel, in_flight: int, seconds: float) -> int:
    """Keep ``in_flight`` Runs in the worker for ``seconds``, then wait for the last; how many finished."""
    sent = finished = 0
    end = time.monotonic() + seconds
    deadline = end + WAIT_S
    while time.monotonic() < end or finished < sent:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sent - finished} executions did not finish")
        while sent - finished < in_flight and time.monotonic() < end:
            sent += 1
            channel.send(sent, RUN)
        for slot, message in channel.receive(1.0):
            if not isinstance(message, ipc.Finished) or not message.ok or message.result != b"2":
                raise RuntimeError(f"slot {slot}: {message!r}")
            finished += 1
    return finished


def measure(args: argparse.Namespace, pythonpath: str | None) -> tuple[float, float, str]:
    """One run: executions per second, the worker's CPU ms per execution, and its usage line."""
    with lone_worker(args.threads, pythonpath) as (worker, channel):
        load(channel, args.in_flight, 1.0)
        before, began = Usage.of(worker.pid), time.monotonic()
        n = load(channel, args.in_flight, args.duration)
        after, took = Usage.of(worker.pid), time.monotonic() - began
    return n / took, after.cpu_ms(before, n), after.per(before, n)


def alternate(args: argparse.Namespace) -> None:
    """``--pairs`` pairs, each side first in every other pair, then the comparison."""
    print(f"{args.in_flight} in flight, {args.threads} runner threads; other = PYTHONPATH {args.other_pythonpath}")

    def run(label: str, _: int) -> float:
        rate, ms, usage = measure(args, args.other_pythonpath if label == "other" else None)
        print(f"  {label:<5} {rate:5.0f}/s  {usage}", flush=True)
        return ms

    print("\n".join(summary(alternated(args.pairs, run), scale=1000)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=16, help="the worker's runner threads")
    parser.add_argument(
        "--other-pythonpath", help="a QuickJS build to alternate with (deploy/quickjs/build.py --target)"
    )
    parser.add_argument("--pairs", type=int, default=6, help="pairs of runs with --other-pythonpath")
    args = parser.parse_args()
    if args.other_pythonpath:
        alternate(args)
        return
    rate, _, usage = measure(args, None)
    print(f"{args.in_flight} in flight, {args.threads} runner threads: {rate:.0f} executions/s")
    print(f"  worker: {usage}")


if __name__ == "__main__":
    main()
