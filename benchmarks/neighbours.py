"""Busy neighbours: resume, cancel and timeout latency while guests spin on every core.

Workers host many executions, so an execution shares its process with others.
This starts ``--spinners`` guests (default: two per core) spinning in
``while (true) {}``, then measures, over fresh connections:

- resume latency: from sending a ``tool_result`` to receiving the next
  ``tool_call`` of an execution making sequential tool calls;
- cancel latency: from ``cancel`` to ``done``, for an execution awaiting a tool
  and for one spinning itself;
- timeout lateness: ``done`` of a spinning guest with ``timeoutMs`` 300,
  measured against ``timeoutMs`` (the TypeScript host gives up at +100 ms).

    python benchmarks/neighbours.py [--spinners N] [--rounds 200] [--url ws://...]

Every wait is bounded; the spinners end by their own timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

from benchkit.client import BlockingClient
from benchkit.processes import start_daemon
from benchkit.stats import percentile
from benchkit.workload import OPTIONS, cancel_message, execute_message, tool_code, tool_result
from websockets.uri import parse_uri

SPIN_MS = 120_000


def spin(url: str, index: int, stop: threading.Event) -> None:
    client = BlockingClient(parse_uri(url))
    client.send_text(execute_message(f"spin-{index}", "while (true) {}", {**OPTIONS, "timeoutMs": SPIN_MS}))
    texts = client.texts()
    assert json.loads(next(texts))["type"] == "started"
    stop.wait(SPIN_MS / 1000)
    client.send_text(cancel_message(f"spin-{index}"))
    for text in texts:
        if json.loads(text)["type"] == "done":
            break
    client.close()


def resume_latencies(url: str, rounds: int, calls: int) -> list[float]:
    """Seconds from each tool_result to the next tool_call, over ``rounds`` executions."""
    samples: list[float] = []
    for round_index in range(rounds):
        client = BlockingClient(parse_uri(url))
        client.send_text(execute_message(f"resume-{round_index}", tool_code(calls)))
        sent: float | None = None
        for text in client.texts():
            message: dict[str, Any] = json.loads(text)
            if message["type"] == "tool_call":
                if sent is not None:
                    samples.append(time.perf_counter() - sent)
                client.send_text(tool_result(message))
                sent = time.perf_counter()
            elif message["type"] == "done":
                break
        client.close()
    return samples


def cancel_latencies(url: str, rounds: int, code: str, wait_for_call: bool) -> list[float]:
    samples: list[float] = []
    for round_index in range(rounds):
        exec_id = f"cancel-{round_index}"
        client = BlockingClient(parse_uri(url))
        client.send_text(execute_message(exec_id, code))
        texts = client.texts()
        json.loads(next(texts))  # started
        if wait_for_call:
            json.loads(next(texts))  # tool_call: now parked
        else:
            time.sleep(0.01)  # now spinning
        sent = time.perf_counter()
        client.send_text(cancel_message(exec_id))
        for text in texts:
            if json.loads(text)["type"] == "done":
                samples.append(time.perf_counter() - sent)
                break
        client.close()
    return samples


def timeout_lateness(url: str, rounds: int, timeout_ms: int) -> list[float]:
    samples: list[float] = []
    for round_index in range(rounds):
        client = BlockingClient(parse_uri(url))
        started = time.perf_counter()
        client.send_text(execute_message(f"t-{round_index}", "while (true) {}", {**OPTIONS, "timeoutMs": timeout_ms}))
        for text in client.texts():
            if json.loads(text)["type"] == "done":
                samples.append(time.perf_counter() - started - timeout_ms / 1000)
                break
        client.close()
    return samples


def show(name: str, samples: list[float], bound_ms: float | None = None) -> None:
    ms = [sample * 1000 for sample in samples]
    line = f"  {name:<38} n={len(ms):<5} p50 {percentile(ms, 0.50):6.2f} ms  p99 {percentile(ms, 0.99):6.2f} ms  max {max(ms):6.2f} ms"
    if bound_ms is not None:
        line += f"  (over {bound_ms:g} ms: {sum(1 for m in ms if m > bound_ms)})"
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spinners", type=int, default=2 * (os.cpu_count() or 1))
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--url")
    parser.add_argument("--daemon-arg", action="append", default=[])
    args = parser.parse_args()
    server = None if args.url else start_daemon(extra_args=args.daemon_arg)
    url = args.url or server.url  # type: ignore[union-attr]
    stop = threading.Event()
    spinners = [threading.Thread(target=spin, args=(url, index, stop)) for index in range(args.spinners)]
    try:
        for thread in spinners:
            thread.start()
        time.sleep(0.5)
        print(f"{args.spinners} guests spinning on {os.cpu_count()} cores")
        show("resume after a tool_result", resume_latencies(url, args.rounds // 10, 10), 10)
        show("cancel, guest awaiting a tool", cancel_latencies(url, args.rounds, "await tools.echo({})", True), 25)
        show("cancel, guest spinning", cancel_latencies(url, args.rounds // 4, "while (true) {}", False), 25)
        show("timeout (300 ms) lateness, guest spinning", timeout_lateness(url, args.rounds // 10, 300), 25)
    finally:
        stop.set()
        for thread in spinners:
            thread.join(timeout=30)
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
