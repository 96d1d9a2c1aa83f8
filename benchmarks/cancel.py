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
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.daemonkit import client, execute, receive, running_daemon

CASES = {
    "awaiting a tool": "await tools.hang({})",
    # The tool call proves the guest is running (not still waiting for a worker) before the cancel.
    "spinning in while (true) {}": "await tools.echo(1); console.log('before'); while (true) {}",
}


def measure(url: str, code: str, runs: int) -> tuple[list[float], int]:
    latencies: list[float] = []
    kept_logs = 0
    for i in range(runs):
        with client(url) as ws:
            ws.send(execute(f"c{i}", code, timeoutMs=60000))
            assert receive(ws)["type"] == "started"
            call = receive(ws)
            assert call["type"] == "tool_call"
            if "while" in code:
                ws.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 1}))
                time.sleep(0.02)
            sent = time.perf_counter()
            ws.send(json.dumps({"type": "cancel", "id": f"c{i}"}))
            done = receive(ws, timeout=5)
            latencies.append((time.perf_counter() - sent) * 1000)
            assert done["error"]["code"] == "timeout", done
            kept_logs += done["logs"] == ["before"]
    return latencies, kept_logs


def report(url: str, runs: int) -> None:
    for name, code in CASES.items():
        latencies, kept = measure(url, code, runs)
        ordered = sorted(latencies)
        p95 = ordered[max(0, round(0.95 * len(ordered)) - 1)]
        line = f"cancel while {name:<28} median {statistics.median(latencies):6.2f} ms  p95 {p95:6.2f} ms  max {ordered[-1]:6.2f} ms  (n={runs}; host bound 25 ms)"
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
    with running_daemon() as daemon:
        report(daemon.url, args.runs)


if __name__ == "__main__":
    main()
