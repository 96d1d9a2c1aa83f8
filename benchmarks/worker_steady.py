"""One worker process fed executions without the daemon: its CPU per execution.

The worker side of the daemon's throughput at c=64: this process plays the daemon on the worker's
channel and keeps ``--in-flight`` Runs of ``1+1`` in the worker (with ``--tools N``, of guests
making N sequential tool calls, each answered at once), sending the next as each finishes,
for ``--duration`` seconds after a one-second warm-up. The worker runs unconfined
(``--no-sandbox``) with one malloc arena, as the daemon's pool starts its zygote (and so every
worker), so that nothing but its loop is measured. Prints the rate and the worker's CPU per
execution (user, system) and context switches. With no daemon and no WebSocket client beside it
on the cores, the figure moves by a few percent between runs, where the whole tree's at c=64
moves by twenty: the measure for a change to the worker alone.

With ``--other-pythonpath DIR --pairs N`` it alternates N pairs of runs, this environment's
QuickJS build against the one in DIR (``deploy/quickjs/build.py --target DIR`` with the edit to
compare left out), and prints each side's range and median, and the pairs one by one (in how many
this side was lower, the ratio at the median).

    python benchmarks/worker_steady.py [--in-flight 64] [--duration 3] [--threads 16] [--tools N]
        [--other-pythonpath DIR --pairs N]

It asserts nothing about time; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchkit.pairs import alternated, summary
from benchkit.processes import with_pythonpath
from benchkit.procfs import CLK_TCK
from benchkit.workload import tool_code

from execbox_runner.protocol import ipc

WAIT_S = 60.0  # any one wait on the worker


def run_message(tools: int) -> tuple[ipc.Run, bytes]:
    """The Run each execution is, and its result: ``1+1``, or ``tools`` sequential tool calls
    (``workload.tool_code``, each answered with its input)."""
    code, result = ("1+1", 2) if not tools else (tool_code(tools), tools * (tools - 1) // 2)
    return ipc.Run(code, WAIT_S, 64 << 20, 100, 64000, [("tools", ["echo"])], 1 << 24), str(result).encode()


@dataclass
class Usage:
    """A process's CPU seconds (user, system) and context switches (voluntary, involuntary), all threads."""

    user: float
    system: float
    voluntary: int
    involuntary: int

    @classmethod
    def of(cls, pid: int) -> Usage:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        switches = {"voluntary_ctxt_switches": 0, "nonvoluntary_ctxt_switches": 0}
        for task in os.listdir(f"/proc/{pid}/task"):
            for line in Path(f"/proc/{pid}/task/{task}/status").read_text().splitlines():
                name, _, value = line.partition(":")
                if name in switches:
                    switches[name] += int(value)
        return cls(int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK, *switches.values())

    def per(self, before: Usage, n: int) -> tuple[float, str]:
        """CPU ms per execution since ``before`` over ``n`` executions, and the usage line."""
        user, system = (self.user - before.user) / n * 1000, (self.system - before.system) / n * 1000
        return user + system, (
            f"{user + system:.3f} ms CPU per execution (user {user:.3f}, system {system:.3f}),"
            f" {(self.voluntary - before.voluntary) / n:.1f} + {(self.involuntary - before.involuntary) / n:.1f}"
            " context switches"
        )


class Channel:
    """The daemon's end of the worker's channel."""

    def __init__(self, sock: socket.socket, tools: int) -> None:
        self.sock = sock
        self.frames = ipc.Unframer()
        self.run, self.result = run_message(tools)

    def receive(self, timeout: float) -> list[tuple[int, ipc.FromWorker]]:
        """What has arrived, waiting up to ``timeout`` for the first of it ([] if nothing did)."""
        self.sock.settimeout(timeout)
        messages: list[tuple[int, ipc.FromWorker]] = []
        try:
            while not messages:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise EOFError("the worker closed its channel")
                self.frames.feed(data)
                while (body := self.frames.next()) is not None:
                    messages.append(ipc.from_worker_decoder.decode(body))
        except TimeoutError:
            pass
        return messages

    def load(self, in_flight: int, seconds: float) -> int:
        """Keep ``in_flight`` Runs in the worker for ``seconds``, then wait for the last; how many finished."""
        sent = finished = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end or finished < sent:
            if time.monotonic() > end + WAIT_S:
                raise TimeoutError(f"{sent - finished} executions did not finish")
            while sent - finished < in_flight and time.monotonic() < end:
                sent += 1
                self.sock.sendall(ipc.frame(sent, self.run))
            answers = []
            for slot, message in self.receive(1.0):
                if isinstance(message, ipc.ToolCalls) and message.calls:
                    answers += [ipc.frame(slot, ipc.Settle(call, True, value)) for call, _, _, value in message.calls]
                    continue
                if not isinstance(message, ipc.Finished) or not message.ok or message.result != self.result:
                    raise RuntimeError(f"slot {slot}: {message!r}")
                finished += 1
            if answers:
                self.sock.sendall(b"".join(answers))
        return finished


def measure(args: argparse.Namespace, pythonpath: str | None) -> tuple[float, float, str]:
    """One run with a fresh worker: executions per second, its CPU ms per execution, its usage line."""
    ours, theirs = socket.socketpair()
    command = [sys.executable, "-m", "execbox_runner.worker.loop", str(theirs.fileno()), "--no-sandbox"]
    environment = {**with_pythonpath(pythonpath), "MALLOC_ARENA_MAX": "1"}
    worker = subprocess.Popen([*command, "--threads", str(args.threads)], pass_fds=[theirs.fileno()], env=environment)
    theirs.close()
    channel = Channel(ours, args.tools)
    try:
        ready = channel.receive(WAIT_S)
        if not ready or not isinstance(ready[0][1], ipc.Ready):
            raise RuntimeError(f"the worker did not start: {ready!r}")
        channel.load(args.in_flight, 1.0)
        before, began = Usage.of(worker.pid), time.monotonic()
        n = channel.load(args.in_flight, args.duration)
        after, took = Usage.of(worker.pid), time.monotonic() - began
    finally:
        ours.close()  # the worker ends with its channel
        worker.wait(timeout=WAIT_S)
    return (n / took, *after.per(before, n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=16, help="the worker's runner threads")
    parser.add_argument("--tools", type=int, default=0, help="sequential tool calls per execution")
    parser.add_argument("--other-pythonpath", help="a QuickJS build to alternate with (deploy/quickjs/build.py)")
    parser.add_argument("--pairs", type=int, default=6, help="pairs of runs with --other-pythonpath")
    args = parser.parse_args()
    print(f"{args.in_flight} in flight, {args.threads} runner threads, {args.tools} tool calls each")
    if not args.other_pythonpath:
        rate, _, usage = measure(args, None)
        print(f"  {rate:.0f} executions/s; worker: {usage}")
        return

    def run(side: str, _: int) -> float:
        rate, ms, usage = measure(args, args.other_pythonpath if side == "other" else None)
        print(f"  {side:<5} {rate:5.0f} executions/s; {usage}", flush=True)
        return ms

    print(f"other = PYTHONPATH {args.other_pythonpath}")
    print("\n".join(summary(alternated(args.pairs, run), scale=1000)))


if __name__ == "__main__":
    main()
