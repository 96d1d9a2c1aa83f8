"""A worker's loop replayed in this one thread: its CPU per execution, with no thread switch and no daemon.

``worker_steady.py`` measures a real worker process, whose threads hand the GIL to each other
and whose figure moves with the machine's scheduling. Here a ``Worker`` of this process is driven
by hand on a socketpair, as its leader drives it: what arrived on the channel is read and
dispatched, every ready slot is run, its reports sent; then this side plays the daemon and answers
each tool call at once with its input. ``--in-flight`` executions are kept going (guests making
``--tools N`` sequential tool calls), the next sent as each finishes, for ``--executions``
executions after a warm-up. The figure is this process's CPU per execution, both sides together:
the worker's Python, the engine, and the few microseconds of the stand-in daemon.

With several ``--in-flight`` values it shows what grows with the executions in flight (each has
a runtime of its own). Under ``perf record`` it shows where: Python, the engine or the kernel.

    python benchmarks/worker_replay.py [--tools 10] [--in-flight 8,64] [--executions 1000] [--rounds 3]

It asserts nothing about time.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time

from benchkit.workload import tool_code

from execbox_runner.protocol import ipc
from execbox_runner.worker.loop import Worker

WARM_UP = 100  # executions before the measured ones
LIMIT_S = 300.0  # the bound of one measure, warm-up included


class Replay:
    """One worker of this process on one end of a socketpair, this side on the other."""

    def __init__(self, tools: int) -> None:
        self.ours, theirs = socket.socketpair()
        self.ours.setblocking(False)
        self.worker = Worker(theirs, None, threads=16)  # not served: its loop is driven here
        code = tool_code(tools) if tools else "1+1"
        self.run = ipc.Run(code, 60.0, 64 << 20, 100, 64000, [("tools", ["echo"])], 1 << 24)
        self.frames = ipc.Unframer()
        self.slot = 0

    def start(self) -> None:
        self.slot += 1
        self.ours.sendall(ipc.frame(self.slot, self.run))

    def turn(self) -> int:
        """The worker reads and runs what is ready; this side answers its tool calls. How many
        executions finished (a failed one raises)."""
        worker = self.worker
        worker._read(block=False)
        while worker.ready:
            worker._run(worker.ready.popleft(), None)
        try:
            self.frames.feed(self.ours.recv(1 << 20))
        except BlockingIOError:
            return 0
        finished, answers = 0, []
        while (body := self.frames.next()) is not None:
            slot, message = ipc.from_worker_decoder.decode(body)
            if isinstance(message, ipc.Finished):
                if not message.ok:
                    raise RuntimeError(f"execution {slot} failed: {message.code}: {message.message}")
                finished += 1
            elif isinstance(message, ipc.ToolCalls):
                answers += [ipc.frame(slot, ipc.Settle(call[0], True, call[3])) for call in message.calls]
        if answers:
            self.ours.sendall(b"".join(answers))
        return finished

    def cpu_per_execution(self, in_flight: int, executions: int) -> float:
        """Microseconds of this process's CPU per execution, ``in_flight`` at once."""
        for _ in range(in_flight):
            self.start()
        finished, counted, began = 0, 0, 0.0
        deadline = time.monotonic() + LIMIT_S
        while counted < executions:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{finished} executions finished in {LIMIT_S:g} s")
            done = self.turn()
            finished += done
            if began == 0.0 and finished >= WARM_UP:
                began, counted = time.process_time(), 0
            elif began:
                counted += done
            for _ in range(done):
                self.start()
        spent = time.process_time() - began
        self._drain(in_flight)
        return spent / counted * 1e6

    def _drain(self, in_flight: int) -> None:
        """Let the executions still going finish, so the next measure starts from none."""
        left = in_flight
        deadline = time.monotonic() + 60
        while left > 0 and time.monotonic() < deadline:
            left -= self.turn()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tools", type=int, default=10, help="sequential tool calls per execution")
    parser.add_argument("--in-flight", default="8,64", help="comma-separated")
    parser.add_argument("--executions", type=int, default=1000, help="measured per round and in-flight value")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    in_flights = [int(value) for value in args.in_flight.split(",")]
    replay = Replay(args.tools)
    figures: dict[int, list[float]] = {n: [] for n in in_flights}
    print(f"{args.tools} sequential tool calls per execution, this process's CPU per execution (us)")
    for round_index in range(args.rounds):
        order = in_flights if round_index % 2 == 0 else list(reversed(in_flights))
        for in_flight in order:
            figures[in_flight].append(replay.cpu_per_execution(in_flight, args.executions))
        print(f"  round {round_index + 1}: " + ", ".join(f"{n} in flight {figures[n][-1]:.0f}" for n in in_flights))
    for in_flight in in_flights:
        values = figures[in_flight]
        print(
            f"  {in_flight:4} in flight: median {statistics.median(values):6.0f} us (range {min(values):.0f}-{max(values):.0f})"
        )


if __name__ == "__main__":
    main()
