"""Fair shares between tenants: one tenant's spinning guests against another's latency.

Starts the daemon with two named tenants (a tokens file, plus any ``--daemon-arg``). Tenant ``a``
keeps ``--spinners`` guests (default 64) spinning in ``while (true) {}`` until their timeouts
(``--spin-timeout``), each starting another as it ends; tenant ``b`` meanwhile runs executions one
after another on fresh connections, alternately ``1+1`` and three sequential tool calls. B's
latency (connect to ``done``) is measured alone and beside A, alternately, ``--rounds`` times
each; the figure is B's p99 beside A against its p99 alone. A's share is the CPU its workers got
while B ran beside it (``execbox_tenant_cpu_seconds_total``, between two of the daemon's samples),
against the machine's cores.

    python benchmarks/tenants.py [--spinners 64] [--executions 250] [--rounds 4] [--daemon-arg=...]

Every wait is bounded; the spinners stop at the end of each round as their guests time out.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchkit.client import BlockingClient, run_execution
from benchkit.processes import Server, start_daemon
from benchkit.stats import percentile, spread
from benchkit.workload import OPTIONS, execute_message, tool_code

TOKENS = "token-a tenant=a\ntoken-b tenant=b\n"
B_CODES = ("1+1", tool_code(3))
SAMPLE_POLL_S = 0.02


class Spinners:
    """Tenant A's load: ``n`` connections, each running spinning guests one after another."""

    def __init__(self, url: str, n: int, timeout_ms: int) -> None:
        self.stop = threading.Event()
        self.done = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._spin, args=(url, i, timeout_ms)) for i in range(n)]
        for thread in self._threads:
            thread.start()

    def _spin(self, url: str, index: int, timeout_ms: int) -> None:
        client = BlockingClient(url, "token-a")
        for run in range(1_000_000):
            if self.stop.is_set():
                break
            client.send(execute_message(f"spin-{index}-{run}", "while (true) {}", {**OPTIONS, "timeoutMs": timeout_ms}))
            while client.receive()["type"] != "done":
                pass
            with self._lock:
                self.done += 1
        client.close()

    def end(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def b_latencies(url: str, executions: int, tag: str) -> list[float]:
    """Milliseconds from connect to ``done`` of tenant B's executions, one after another."""
    samples: list[float] = []
    for index in range(executions):
        seconds, done, error = run_execution(url, f"b-{tag}-{index}", B_CODES[index % 2], "token-b")
        if done is None or not done.get("ok"):
            raise RuntimeError(f"tenant b's execution failed: {error or done}")
        samples.append(seconds * 1000)
    return samples


def tenant_cpu(server: Server) -> dict[str, float]:
    """``execbox_tenant_cpu_seconds_total`` by tenant, from the daemon's ``/metrics``."""
    url = server.url.replace("ws://", "http://", 1).rstrip("/") + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    seconds: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("execbox_tenant_cpu_seconds_total{"):
            labels, value = line.rsplit(" ", 1)
            seconds[labels.split('tenant="', 1)[1].split('"', 1)[0]] = float(value)
    return seconds


def next_sample(server: Server, tenant: str) -> tuple[float, float]:
    """``tenant``'s CPU seconds at the daemon's next sample of them, and when it was taken (to
    ``SAMPLE_POLL_S``): the daemon reads them once a second."""
    first = tenant_cpu(server).get(tenant, 0.0)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(SAMPLE_POLL_S)
        if (seconds := tenant_cpu(server).get(tenant, 0.0)) != first:
            return seconds, time.monotonic()
    raise RuntimeError(f"tenant {tenant}'s CPU was not sampled within 5 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spinners", type=int, default=64)
    parser.add_argument("--spin-timeout", type=int, default=2000, help="the spinners' timeoutMs")
    parser.add_argument("--executions", type=int, default=250, help="tenant b's executions per round and side")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--daemon-arg", action="append", default=[], help="passed to `serve` (repeatable)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tokens = Path(scratch, "tokens")
        tokens.write_text(TOKENS)
        tokens.chmod(0o600)
        daemon = start_daemon(extra_args=["--tokens-file", str(tokens), *args.daemon_arg])
        try:
            b_latencies(daemon.url, 20, "warm")
            alone: list[float] = []
            beside: list[float] = []
            a_cpu = 0.0
            window = 0.0
            for round_ in range(args.rounds):
                alone += b_latencies(daemon.url, args.executions, f"alone-{round_}")
                spinners = Spinners(daemon.url, args.spinners, args.spin_timeout)
                try:
                    time.sleep(0.5)
                    before, t0 = next_sample(daemon, "a")
                    beside += b_latencies(daemon.url, args.executions, f"beside-{round_}")
                    after, t1 = next_sample(daemon, "a")
                    a_cpu, window = a_cpu + after - before, window + t1 - t0
                finally:
                    spinners.end()
        finally:
            daemon.stop()
    cores = os.cpu_count() or 1
    print(f"tenant a: {args.spinners} guests spinning; tenant b: executions one at a time; {cores} cores")
    print(f"  b alone            {spread(alone)}")
    print(f"  b beside a         {spread(beside)}")
    print(f"  b's p99 beside a / alone: {percentile(beside, 0.99) / percentile(alone, 0.99):.2f}x")
    print(f"  a's CPU while b ran beside it: {a_cpu / window:.2f} of {cores} cores")


if __name__ == "__main__":
    main()
