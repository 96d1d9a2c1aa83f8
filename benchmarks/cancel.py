"""Cancel latency: how long after a host's ``cancel`` the ``done`` arrives.

The TypeScript host force-closes the transport 25 ms after it sends ``cancel``,
so that is the bound that matters. Measured for a guest awaiting a tool and
for a guest spinning in ``while (true) {}``, over loopback, with the daemon
started here (or ``--url`` of a running one). Also checks that the spinning
guest's earlier log line survives the interruption.

    python benchmarks/cancel.py [--runs 50] [--url ws://127.0.0.1:8765/]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from typing import Any

from benchkit.client import BlockingClient
from benchkit.processes import start_daemon
from benchkit.stats import percentile
from benchkit.workload import OPTIONS, cancel_message, execute_message, providers, tool_result
from websockets.uri import parse_uri

CASES = {
    "awaiting a tool": "await tools.hang({})",
    # The tool call proves the guest is running (not still waiting for a worker) before the cancel.
    "spinning in while (true) {}": "await tools.echo(1); console.log('before'); while (true) {}",
}
MANIFEST = providers("echo", "hang")  # the host never answers ``hang``
LONG_TIMEOUT = {**OPTIONS, "timeoutMs": 60000}  # only the cancel may end the execution
SETTLE_S = 0.02  # after answering the tool, so the guest is spinning when the cancel arrives


def receive(texts: Iterator[bytes]) -> dict[str, Any]:
    """The next message of the connection whose ``texts()`` this is."""
    message: dict[str, Any] = json.loads(next(texts))
    return message


def measure(url: str, code: str, runs: int) -> tuple[list[float], int]:
    """Milliseconds from sending ``cancel`` to receiving ``done``, per run; and in how many the log survived."""
    uri = parse_uri(url)
    latencies: list[float] = []
    kept_logs = 0
    for i in range(runs):
        client = BlockingClient(uri)
        texts = client.texts()  # one iterator per connection: a read may hold several messages
        client.send_text(execute_message(f"c{i}", code, LONG_TIMEOUT, MANIFEST))
        assert receive(texts)["type"] == "started"
        call = receive(texts)
        assert call["type"] == "tool_call"
        if "while" in code:
            client.send_text(tool_result(call))
            time.sleep(SETTLE_S)
        sent = time.perf_counter()
        client.send_text(cancel_message(f"c{i}"))
        done = receive(texts)
        latencies.append((time.perf_counter() - sent) * 1000)
        client.close()
        assert done["error"]["code"] == "timeout", done
        kept_logs += done["logs"] == ["before"]
    return latencies, kept_logs


def report(url: str, runs: int) -> None:
    for name, code in CASES.items():
        latencies, kept = measure(url, code, runs)
        median, p95, worst = percentile(latencies, 0.5), percentile(latencies, 0.95), max(latencies)
        line = f"cancel while {name:<28} median {median:6.2f} ms  p95 {p95:6.2f} ms  max {worst:6.2f} ms  (n={runs}; host bound 25 ms)"
        if "while" in code:
            line += f"; logs kept in {kept}/{runs}"
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--url")
    args = parser.parse_args()
    if args.url:
        report(args.url, args.runs)
        return
    daemon = start_daemon()
    try:
        report(daemon.url, args.runs)
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
