"""One worker process fed trivial executions without the daemon: its CPU per execution.

The worker side of ``bench.py``'s throughput at c=64: this process plays the
daemon on the worker's channel and keeps ``--in-flight`` Runs of ``1+1`` in the
worker, sending the next as each finishes, for ``--duration`` seconds after a
one-second warm-up. Prints the rate and the worker's CPU per execution (user,
system) and context switches. With no daemon and no WebSocket client beside it
on the cores, the figure moves by a few percent between runs, where the whole
tree's at c=64 moves by twenty: the measure for a change to the worker alone.

    python benchmarks/worker_steady.py [--in-flight 64] [--duration 3] [--threads 16]

It asserts nothing about time; every wait is bounded.
"""

from __future__ import annotations

import argparse
import time

from benchkit.lone_worker import WAIT_S, Channel, Usage, lone_worker

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=16, help="the worker's runner threads")
    args = parser.parse_args()
    with lone_worker(args.threads) as (worker, channel):
        load(channel, args.in_flight, 1.0)
        before, began = Usage.of(worker.pid), time.monotonic()
        n = load(channel, args.in_flight, args.duration)
        after, took = Usage.of(worker.pid), time.monotonic() - began
    print(f"{args.in_flight} in flight, {args.threads} runner threads: {n / took:.0f} executions/s")
    print(f"  worker: {after.per(before, n)}")


if __name__ == "__main__":
    main()
