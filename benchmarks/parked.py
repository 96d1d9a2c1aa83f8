"""N executions at once, each awaiting a tool that answers after a delay.

The workload of real hosts: most executions wait on slow tools. Prints the
wall time until the last ``done``, how many were refused (HTTP 503) or failed,
the peak RSS of the daemon's whole process tree (daemon, zygote, workers), and
the memory per parked execution (peak RSS over the idle tree's, divided by N).

    python benchmarks/parked.py [--n 1000] [--delay 2.0] [--opening 256] [--url ws://...] [--daemon-arg=--flag ...]

Without ``--url`` it starts ``python -m execbox_runner serve`` on 127.0.0.1
with default settings (plus any ``--daemon-arg``). Every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
from dataclasses import dataclass, field

from benchkit.processes import start_daemon
from benchkit.procfs import tree_cpu_seconds, tree_rss_bytes
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

CODE = "const r = await tools.slow({}); r + 1"
PROVIDERS = [{"name": "tools", "tools": {"slow": {"safeName": "slow", "originalName": "slow"}}, "types": ""}]
OPTIONS = {"timeoutMs": 60_000, "memoryLimitBytes": 64 << 20, "maxLogLines": 100, "maxLogChars": 64_000}


@dataclass
class Outcome:
    ok: int = 0
    refused: int = 0
    failed: list[str] = field(default_factory=list)
    finished_at: list[float] = field(default_factory=list)
    parked_at: list[float] = field(default_factory=list)  # when each tool_call arrived


async def one(
    url: str, index: int, delay: float, outcome: Outcome, start: asyncio.Event, opening: asyncio.Semaphore
) -> None:
    await start.wait()
    try:
        # Hosts are independent machines that each send their request as soon as they connect;
        # one client process opening thousands at once would leave most connected but silent for
        # seconds, which the daemon treats as an idle flood. So at most --opening at a time.
        async with opening:
            ws = await connect(url, open_timeout=60, close_timeout=5, max_queue=4)
        async with ws:
            await ws.send(
                json.dumps(
                    {"type": "execute", "id": f"e{index}", "code": CODE, "providers": PROVIDERS, "options": OPTIONS}
                )
            )
            while True:
                message = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if message["type"] == "tool_call":
                    outcome.parked_at.append(time.monotonic())
                    await asyncio.sleep(delay)
                    await ws.send(
                        json.dumps({"type": "tool_result", "callId": message["callId"], "ok": True, "result": index})
                    )
                elif message["type"] == "done":
                    if message.get("ok") and message.get("result") == index + 1:
                        outcome.ok += 1
                    else:
                        outcome.failed.append(str(message.get("error")))
                    outcome.finished_at.append(time.monotonic())
                    return
    except InvalidStatus as exc:
        if exc.response.status_code == 503:
            outcome.refused += 1
        else:
            outcome.failed.append(f"HTTP {exc.response.status_code}")
    except Exception as exc:  # a benchmark counts failures, it does not stop at the first
        outcome.failed.append(type(exc).__name__ + ": " + str(exc)[:80])


async def sample_peak(root: int, stop: asyncio.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], tree_rss_bytes(root))
        await asyncio.sleep(0.1)


async def measure(url: str, n: int, delay: float, root: int | None, opening: int) -> None:
    outcome = Outcome()
    start, stop = asyncio.Event(), asyncio.Event()
    peak = [0]
    idle = tree_rss_bytes(root) if root else 0
    daemon_before, tree_before, _ = tree_cpu_seconds(root) if root else (0.0, 0.0, 0)
    sampler = asyncio.create_task(sample_peak(root, stop, peak)) if root else None
    handshakes = asyncio.Semaphore(opening)
    tasks = [asyncio.create_task(one(url, index, delay, outcome, start, handshakes)) for index in range(n)]
    began = time.monotonic()
    start.set()
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=600)
    wall = (max(outcome.finished_at) if outcome.finished_at else time.monotonic()) - began
    stop.set()
    if sampler is not None:
        await sampler
    print(f"executions: {n}, tool delay {delay:g} s")
    print(f"  ok {outcome.ok}, refused (503) {outcome.refused}, failed {len(outcome.failed)}")
    for reason in sorted(set(outcome.failed))[:5]:
        print(f"    failure: {reason}")
    print(f"  wall time until the last done: {wall:.2f} s ({wall - delay:.2f} s beyond the tool delay)")
    if outcome.parked_at:
        print(
            f"  all {len(outcome.parked_at)} parked (tool_call received) after {max(outcome.parked_at) - began:.2f} s"
        )
    client = resource.getrusage(resource.RUSAGE_SELF)
    print(f"  CPU of this client (same machine): {client.ru_utime + client.ru_stime:.2f} s")
    if root:
        daemon_after, tree_after, _ = tree_cpu_seconds(root)
        daemon_cpu = daemon_after - daemon_before
        cpu = daemon_cpu + tree_after - tree_before
        print(f"  daemon tree: idle RSS {idle / 2**20:.0f} MiB, peak RSS {peak[0] / 2**20:.0f} MiB")
        print(f"  memory per parked execution: {(peak[0] - idle) / max(n, 1) / 2**20:.3f} MiB")
        print(f"  CPU of the daemon tree: {cpu:.2f} s ({cpu / max(n, 1) * 1000:.2f} ms per execution)")
        print(
            f"  of which the daemon process: {daemon_cpu:.2f} s ({daemon_cpu / max(n, 1) * 1000:.2f} ms per execution)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--delay", type=float, default=2.0)
    parser.add_argument("--url")
    parser.add_argument("--opening", type=int, default=256, help="opening handshakes under way at once")
    parser.add_argument("--daemon-arg", action="append", default=[])
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    server = None if args.url else start_daemon(extra_args=args.daemon_arg)
    if server is not None:
        time.sleep(1.0)  # let the warm workers settle before measuring the idle tree
    try:
        url = args.url or server.url  # type: ignore[union-attr]
        asyncio.run(measure(url, args.n, args.delay, server.process.pid if server else None, args.opening))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
