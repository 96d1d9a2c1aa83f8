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
import time

from benchkit.lone_worker import WAIT_S, Channel, Usage, lone_worker

from execbox_runner.protocol import ipc

CODE = "const r = await tools.slow({}); r + 1"


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
    with lone_worker(args.threads) as (worker, channel):
        time.sleep(0.5)  # its spare runtime made, its threads idle
        before = Usage.of(worker.pid)
        began = time.monotonic()
        calls = ramp(channel, args.n, args.pace)
        ramped, parked = time.monotonic() - began, Usage.of(worker.pid)
        settle(channel, calls)
        done = Usage.of(worker.pid)
    print(f"{args.n} runs {args.pace * 1000:g} ms apart, {args.threads} runner threads")
    print(f"  all parked after {ramped:.2f} s (the last Run was sent at {(args.n - 1) * args.pace:.2f} s)")
    print(f"  ramp:    {parked.per(before, args.n)}")
    print(f"  settle:  {done.per(parked, args.n)}")


if __name__ == "__main__":
    main()
