"""Busy neighbours: resume, cancel and timeout latency while guests spin on every core.

Workers host many executions, so an execution shares its process with others. This starts the
daemon (default settings plus any ``--daemon-arg``) and ``--spinners`` guests (default: two per
core) spinning in ``while (true) {}``, then measures, each execution on a fresh connection with
the latency client:

- resume latency: from sending a ``tool_result`` to receiving the next ``tool_call`` of an
  execution making sequential tool calls;
- cancel latency, from ``cancel`` to ``done`` (the TypeScript host force-closes 25 ms after it
  cancels): for a guest awaiting a tool, and for a guest spinning after a log line, which must
  survive the cancel (a tool call after the line proves it written);
- timeout lateness: ``done`` of a spinning guest with ``timeoutMs`` 300, against ``timeoutMs``.

``--spinners 0`` measures the same on an idle daemon; ``--spinners 64`` with every core saturated.

    python benchmarks/neighbours.py [--spinners N] [--rounds 200] [--daemon-arg=...]

Every wait is bounded; the spinners are cancelled at the end.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from benchkit.client import BlockingClient
from benchkit.processes import start_daemon
from benchkit.stats import spread
from benchkit.workload import OPTIONS, cancel_message, execute_message, providers, tool_code, tool_result

SPIN_MS = 120_000
MANIFEST = providers("echo", "hang")  # ``hang`` is never answered
# Its second tool call shows that the line is written; once that is answered, the guest spins.
SPINNING = "await tools.echo(1); console.log('before'); await tools.echo(2); while (true) {}"


def spin(url: str, index: int, stop: threading.Event) -> None:
    client = BlockingClient(url)
    client.send(execute_message(f"spin-{index}", "while (true) {}", {**OPTIONS, "timeoutMs": SPIN_MS}))
    assert client.receive()["type"] == "started"
    stop.wait(SPIN_MS / 1000)
    client.send(cancel_message(f"spin-{index}"))
    while client.receive()["type"] != "done":
        pass
    client.close()


def resume_latencies(url: str, rounds: int, calls: int) -> list[float]:
    """Milliseconds from each ``tool_result`` to the next ``tool_call``, over ``rounds`` executions."""
    samples: list[float] = []
    for index in range(rounds):
        client = BlockingClient(url)
        client.send(execute_message(f"resume-{index}", tool_code(calls)))
        sent: float | None = None
        for message in client.incoming:
            if message["type"] == "tool_call":
                if sent is not None:
                    samples.append((time.perf_counter() - sent) * 1000)
                client.send(tool_result(message))
                sent = time.perf_counter()
            elif message["type"] == "done":
                break
        client.close()
    return samples


def cancel_latencies(url: str, rounds: int, code: str) -> tuple[list[float], int]:
    """Milliseconds from ``cancel`` to ``done``; in how many ``done``s the guest's log line survived."""
    samples: list[float] = []
    kept = 0
    for index in range(rounds):
        client = BlockingClient(url)
        client.send(execute_message(f"cancel-{index}", code, {**OPTIONS, "timeoutMs": 60_000}, MANIFEST))
        assert client.receive()["type"] == "started"
        call = client.receive()  # the guest is running, awaiting a tool
        if code == SPINNING:
            client.send(tool_result(call))
            client.send(tool_result(client.receive()))  # the line is written
            time.sleep(0.02)  # now spinning
        sent = time.perf_counter()
        client.send(cancel_message(f"cancel-{index}"))
        while (done := client.receive())["type"] != "done":
            pass
        samples.append((time.perf_counter() - sent) * 1000)
        kept += done.get("logs") == ["before"]
        client.close()
    return samples, kept


def timeout_lateness(url: str, rounds: int, timeout_ms: int) -> list[float]:
    samples: list[float] = []
    for index in range(rounds):
        client = BlockingClient(url)
        started = time.perf_counter()
        client.send(execute_message(f"t-{index}", "while (true) {}", {**OPTIONS, "timeoutMs": timeout_ms}))
        while client.receive()["type"] != "done":
            pass
        samples.append((time.perf_counter() - started) * 1000 - timeout_ms)
        client.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spinners", type=int, default=2 * (os.cpu_count() or 1))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--daemon-arg", action="append", default=[], help="passed to `serve` (repeatable)")
    args = parser.parse_args()
    daemon = start_daemon(extra_args=args.daemon_arg)
    stop = threading.Event()
    spinners = [threading.Thread(target=spin, args=(daemon.url, i, stop)) for i in range(args.spinners)]
    try:
        for thread in spinners:
            thread.start()
        time.sleep(0.5)
        url, rounds = daemon.url, args.rounds
        print(f"{args.spinners} guests spinning on {os.cpu_count()} cores")
        awaiting, _ = cancel_latencies(url, rounds, "await tools.hang({})")
        spinning, kept = cancel_latencies(url, rounds // 4 or 1, SPINNING)
        print(f"  resume after a tool_result                {spread(resume_latencies(url, rounds // 10 or 1, 10), 10)}")
        print(f"  cancel, guest awaiting a tool             {spread(awaiting, 25)}")
        print(f"  cancel, guest spinning                    {spread(spinning, 25)}; log kept in {kept}/{len(spinning)}")
        lateness = timeout_lateness(url, rounds // 10 or 1, 300)
        print(f"  timeout (300 ms) lateness, guest spinning {spread(lateness, 25)}")
    finally:
        stop.set()
        for thread in spinners:
            thread.join(timeout=30)
        daemon.stop()


if __name__ == "__main__":
    main()
