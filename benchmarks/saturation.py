"""Timeouts under CPU saturation: do spinning guests get their ``done`` on time?

Starts ``--guests`` (default 64) executions of ``while (true) {}`` at once, each
on its own connection with ``timeoutMs`` ``--timeout-ms`` (default 3000), and
measures each ``done``'s lateness: from sending ``execute`` to receiving
``done``, minus ``timeoutMs`` (the TypeScript host gives up at +100 ms). While
they spin, it cancels executions parked on a tool call on other connections
and measures cancel-to-``done`` (the host hard-closes at 25 ms).

    python benchmarks/saturation.py [--guests 64] [--timeout-ms 3000] [--rounds 3]
        [--daemon-arg=--profile=hardened] [--url ws://...]

It prints figures and asserts nothing about time. Every wait is bounded (the
socket timeout); the guests end by their own timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

from benchkit.client import BlockingClient
from benchkit.processes import start_daemon
from benchkit.stats import percentile
from benchkit.workload import OPTIONS, cancel_message, execute_message
from websockets.uri import WebSocketURI, parse_uri

LATE_MS = 100.0  # the TypeScript host's grace after timeoutMs
CANCEL_MS = 25.0  # the TypeScript host's hard close after cancel
CANCELS_PER_ROUND = 10


def spin(
    uri: WebSocketURI, exec_id: str, timeout_ms: int, start: threading.Barrier, lateness: list[tuple[float, float]]
) -> None:
    """One spinning guest: wait for the others, send, then time the ``done`` against ``timeoutMs``,
    as the host sees it and as the daemon counts it (``durationMs``)."""
    client = BlockingClient(uri)
    start.wait()
    sent = time.perf_counter()
    client.send_text(execute_message(exec_id, "while (true) {}", {**OPTIONS, "timeoutMs": timeout_ms}))
    for text in client.texts():
        message = json.loads(text)
        if message["type"] == "done":
            lateness.append(((time.perf_counter() - sent) * 1000 - timeout_ms, message["durationMs"] - timeout_ms))
            assert message.get("error", {}).get("code") == "timeout", message
            break
    client.close()


def cancel_latencies(uri: WebSocketURI, prefix: str, count: int, pause_s: float) -> list[float]:
    """Milliseconds from ``cancel`` to ``done`` for executions parked on a tool call."""
    samples = []
    for index in range(count):
        exec_id = f"{prefix}-{index}"
        client = BlockingClient(uri)
        client.send_text(execute_message(exec_id, "await tools.echo({})"))
        texts = client.texts()
        while json.loads(next(texts))["type"] != "tool_call":
            pass
        sent = time.perf_counter()
        client.send_text(cancel_message(exec_id))
        for text in texts:
            if json.loads(text)["type"] == "done":
                samples.append((time.perf_counter() - sent) * 1000)
                break
        client.close()
        time.sleep(pause_s)
    return samples


def storm(
    uri: WebSocketURI, round_index: int, guests: int, timeout_ms: int
) -> tuple[list[tuple[float, float]], list[float]]:
    """One round: ``guests`` spinning at once, cancels measured meanwhile; (lateness as the host
    and as the daemon sees it, cancels) in ms."""
    lateness: list[tuple[float, float]] = []
    start = threading.Barrier(guests + 1)
    threads = [
        threading.Thread(target=spin, args=(uri, f"r{round_index}-spin-{index}", timeout_ms, start, lateness))
        for index in range(guests)
    ]
    for thread in threads:
        thread.start()
    start.wait()
    time.sleep(timeout_ms / 1000 / 5)  # the guests are spinning by now
    cancels = cancel_latencies(
        uri, f"r{round_index}-cancel", CANCELS_PER_ROUND, timeout_ms / 1000 / 2 / CANCELS_PER_ROUND
    )
    for thread in threads:
        thread.join(timeout=timeout_ms / 1000 + 60)
    return lateness, cancels


def show(name: str, ms: list[float], bound_ms: float) -> None:
    if not ms:
        print(f"  {name:<32} no samples")
        return
    print(
        f"  {name:<32} n={len(ms):<4} p50 {percentile(ms, 0.50):7.1f} ms  p99 {percentile(ms, 0.99):7.1f} ms"
        f"  max {max(ms):7.1f} ms  over {bound_ms:g} ms: {sum(1 for m in ms if m > bound_ms)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--guests", type=int, default=64)
    parser.add_argument("--timeout-ms", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url")
    parser.add_argument("--daemon-arg", action="append", default=[])
    args = parser.parse_args()
    server = None if args.url else start_daemon(extra_args=args.daemon_arg)
    uri = parse_uri(args.url or server.url)  # type: ignore[union-attr]
    try:
        print(f"{args.guests} guests spinning at once, timeoutMs {args.timeout_ms}, on {os.cpu_count()} cores")
        all_lateness: list[tuple[float, float]] = []
        all_cancels: list[float] = []
        for round_index in range(args.rounds):
            lateness, cancels = storm(uri, round_index, args.guests, args.timeout_ms)
            show(f"round {round_index}: done lateness", [host for host, _ in lateness], LATE_MS)
            show(f"round {round_index}: cancel to done", cancels, CANCEL_MS)
            all_lateness += lateness
            all_cancels += cancels
        show("all: done lateness (host)", [host for host, _ in all_lateness], LATE_MS)
        show("all: durationMs - timeoutMs", [daemon for _, daemon in all_lateness], LATE_MS)
        show("all: cancel to done", all_cancels, CANCEL_MS)
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
