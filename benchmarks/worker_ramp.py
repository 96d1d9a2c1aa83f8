"""One worker process under a ramp of parked executions, without the daemon.

The worker side of ``parked.py``: this process plays the daemon on the
worker's channel, sending ``--n`` Runs ``--pace`` seconds apart (0: all at
once), each a guest that awaits one tool call, and answers every tool call once
all have parked. Prints the ramp's wall time and, for the ramp and for the
settling, the worker's CPU per execution (user and system) and its context
switches per execution. A worker that falls behind its Runs shows here as
more CPU per execution, not less.

    python benchmarks/worker_ramp.py [--n 1000] [--pace 0.0008] [--threads 16]

The worker runs unconfined (``--no-sandbox``) so that nothing but its loop is
measured. It asserts nothing about time; every wait is bounded.
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

from benchkit.procfs import CLK_TCK

from execbox_runner.protocol import ipc

CODE = "const r = await tools.slow({}); r + 1"
WAIT_S = 60.0  # any one wait on the worker


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
        voluntary = involuntary = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            for line in Path(f"/proc/{pid}/task/{task}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    voluntary += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    involuntary += int(line.split()[1])
        return cls(int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK, voluntary, involuntary)

    def per(self, before: Usage, n: int) -> str:
        user, system = (self.user - before.user) / n * 1000, (self.system - before.system) / n * 1000
        return (
            f"{user + system:.3f} ms CPU per execution (user {user:.3f}, system {system:.3f}),"
            f" {(self.voluntary - before.voluntary) / n:.1f} + {(self.involuntary - before.involuntary) / n:.1f}"
            " context switches"
        )


class Channel:
    """The daemon's end of the worker's channel."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.frames = ipc.Unframer()

    def send(self, slot: int, message: ipc.ToWorker) -> None:
        self.sock.sendall(ipc.frame(slot, message))

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


def ramp(channel: Channel, n: int, pace: float) -> dict[int, int]:
    """Send the Runs ``pace`` apart until every guest has parked; each slot's call id."""
    run = ipc.Run(CODE, WAIT_S, 64 << 20, 100, 64000, [("tools", ["slow"])], 1 << 24)
    calls: dict[int, int] = {}
    sent, start, deadline = 0, time.monotonic(), time.monotonic() + n * pace + WAIT_S
    while len(calls) < n:
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"{len(calls)} of {n} guests parked")
        while sent < n and now >= start + sent * pace:
            sent += 1
            channel.send(sent, run)
        due = start + sent * pace - time.monotonic() if sent < n else 0.01
        for slot, message in channel.receive(max(due, 0.0001)):
            if not isinstance(message, ipc.ToolCalls) or len(message.calls) != 1:
                raise RuntimeError(f"slot {slot}: {message!r}")
            calls[slot] = message.calls[0][0]
    return calls


def settle(channel: Channel, calls: dict[int, int]) -> None:
    """Answer every tool call; wait for every execution to finish ok."""
    for slot, call_id in calls.items():
        channel.send(slot, ipc.Settle(call_id, True, b"1"))
    finished, deadline = 0, time.monotonic() + WAIT_S
    while finished < len(calls):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{finished} of {len(calls)} finished")
        for slot, message in channel.receive(0.1):
            if not isinstance(message, ipc.Finished) or not message.ok:
                raise RuntimeError(f"slot {slot}: {message!r}")
            finished += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--pace", type=float, default=0.0008, help="seconds between Runs (0: all at once)")
    parser.add_argument("--threads", type=int, default=16, help="the worker's runner threads")
    args = parser.parse_args()
    ours, theirs = socket.socketpair()
    command = [sys.executable, "-m", "execbox_runner.worker.loop", str(theirs.fileno()), "--no-sandbox"]
    # One malloc arena, as the daemon's pool starts its zygote (and so every worker).
    environment = {**os.environ, "MALLOC_ARENA_MAX": "1"}
    worker = subprocess.Popen([*command, "--threads", str(args.threads)], pass_fds=[theirs.fileno()], env=environment)
    theirs.close()
    channel = Channel(ours)
    try:
        ready = channel.receive(WAIT_S)
        if not ready or not isinstance(ready[0][1], ipc.Ready):
            raise RuntimeError(f"the worker did not start: {ready!r}")
        time.sleep(0.5)  # its spare runtime made, its threads idle
        before = Usage.of(worker.pid)
        began = time.monotonic()
        calls = ramp(channel, args.n, args.pace)
        ramped, parked = time.monotonic() - began, Usage.of(worker.pid)
        settle(channel, calls)
        done = Usage.of(worker.pid)
    finally:
        ours.close()
        worker.wait(timeout=WAIT_S)
    print(f"{args.n} runs {args.pace * 1000:g} ms apart, {args.threads} runner threads")
    print(f"  all parked after {ramped:.2f} s (the last Run was sent at {(args.n - 1) * args.pace:.2f} s)")
    print(f"  ramp:    {parked.per(before, args.n)}")
    print(f"  settle:  {done.per(parked, args.n)}")


if __name__ == "__main__":
    main()
