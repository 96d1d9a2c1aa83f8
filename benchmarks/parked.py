"""N executions at once, each awaiting a tool that answers after a delay.

The workload of real hosts: most executions wait on slow tools. Prints the
wall time until the last ``done``, how many were refused (HTTP 503) or failed,
when the last one parked, the peak RSS of the daemon's whole process tree
(daemon, zygote, workers), the memory per parked execution (peak RSS over the
idle tree's, divided by N; and the daemon process's own share), and the CPU of
the daemon tree and of the client. ``--timeline`` also prints each process's
CPU, as a share of one core, every 0.1 s: which side a ramp waits on.

    python benchmarks/parked.py [--n 1000] [--delay 2.0] [--opening 256] [--client raw|websockets]
                                [--timeline] [--url ws://127.0.0.1:PORT/] [--daemon-arg=--flag ...]

The client runs in its own process (``benchkit.parked_client``) while this one
samples the RSS: ``raw`` (default) is the hand-rolled RFC 6455 client on an
epoll loop, ``websockets`` is websockets' asyncio client, about four times its
CPU per session. Without ``--url`` it starts ``python -m execbox_runner serve`` on
127.0.0.1 with default settings (plus any ``--daemon-arg``). Every wait is
bounded.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Final

from benchkit.parked_client import MODES
from benchkit.parking import RUN_S, raise_nofile_limit
from benchkit.processes import STARTUP_TIMEOUT_S, STOP_TIMEOUT_S, Lines, popen_module, start_daemon
from benchkit.procfs import (
    CLK_TCK,
    cpu_ticks,
    machine_busy_ticks,
    rss_bytes,
    tree_cpu_seconds,
    tree_rss_bytes,
    tree_ticks,
)

SAMPLE_S: Final = 0.1  # RSS sampling period


@dataclass
class Observed:
    """What this process saw of the daemon tree and the machine while the client ran."""

    peak_rss: int = 0
    daemon_peak_rss: int = 0  # the daemon process alone
    client_pid: int = 0
    daemon_cpu: float = 0.0  # the daemon process itself
    descendants_cpu: float = 0.0  # zygote and workers, live or reaped
    machine_busy: float = 0.0  # CPU seconds of every process on the box
    sampler_cpu: float = 0.0  # this process's own, mostly the RSS sampling
    wall: float = 0.0
    # With --timeline: (seconds since the start, CPU ticks so far by PID), one per sample.
    timeline: list[tuple[float, dict[int, int]]] = field(default_factory=list)


def run_client(
    url: str, mode: str, n: int, delay: float, opening: int, root: int | None, timeline: bool
) -> tuple[dict[str, Any], Observed]:
    """Run the client process, sampling the daemon tree's RSS meanwhile; its result and what this process observed."""
    process = popen_module("parked_client", mode, url, str(n), str(delay), str(opening), stdin=subprocess.PIPE)
    assert process.stdin is not None
    lines = Lines(process)
    seen = Observed(client_pid=process.pid)
    try:
        if lines.get(STARTUP_TIMEOUT_S) != "ready\n":
            raise RuntimeError("parked client failed to start")
        daemon0, tree0, _ = tree_cpu_seconds(root) if root else (0.0, 0.0, 0)
        busy0, _ = machine_busy_ticks()
        t0, cpu0 = time.monotonic(), time.process_time()
        process.stdin.write("go\n")
        process.stdin.flush()
        deadline = t0 + delay + RUN_S + STOP_TIMEOUT_S  # the client bounds itself to delay + RUN_S
        while (line := lines.get(SAMPLE_S)) is None:
            tree = tree_ticks(root) if root else {}
            if root:
                seen.peak_rss = max(seen.peak_rss, sum(rss_bytes(pid) for pid in tree))
                seen.daemon_peak_rss = max(seen.daemon_peak_rss, rss_bytes(root))
            if timeline:
                seen.timeline.append((time.monotonic() - t0, {**tree, process.pid: cpu_ticks(process.pid)}))
            if time.monotonic() > deadline:
                raise RuntimeError("parked client overran its time limit")
        if not line:
            raise RuntimeError("parked client died")
        seen.wall = time.monotonic() - t0
        seen.machine_busy = (machine_busy_ticks()[0] - busy0) / CLK_TCK
        seen.sampler_cpu = time.process_time() - cpu0
        if root:
            daemon1, tree1, _ = tree_cpu_seconds(root)
            seen.daemon_cpu, seen.descendants_cpu = daemon1 - daemon0, tree1 - tree0
        return json.loads(line), seen
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def measure(url: str, mode: str, n: int, delay: float, opening: int, root: int | None, timeline: bool) -> None:
    """One run of ``n`` parked executions; its figures on stdout."""
    idle = tree_rss_bytes(root) if root else 0
    daemon_idle = rss_bytes(root) if root else 0
    result, seen = run_client(url, mode, n, delay, opening, root, timeline)
    parked, finished = result["parked_s"], result["finished_s"]
    wall = max(finished) if finished else result["elapsed_s"]
    per = max(n, 1)
    print(f"executions: {n}, tool delay {delay:g} s, client {mode}, at most {opening} handshakes at a time")
    print(f"  ok {result['ok']}, refused (503) {result['refused']}, failed {result['failed']}")
    for reason, count in result["failure_reasons"].items():
        print(f"    failure ({count}x): {reason}")
    print(f"  wall time until the last done: {wall:.2f} s ({wall - delay:.2f} s beyond the tool delay)")
    if parked:
        how_many = "all" if len(parked) == n else f"{len(parked)} of"
        print(f"  {how_many} {n} parked (tool_call received) after {max(parked):.2f} s")
    client_cpu = result["cpu_s"]
    print(
        f"  CPU of the client ({mode}, own process): {client_cpu:.2f} s ({client_cpu / per * 1000:.2f} ms per execution)"
    )
    if seen.timeline:
        print_timeline(seen.timeline, root, seen.client_pid)
    if root:
        cpu = seen.daemon_cpu + seen.descendants_cpu
        print(f"  daemon tree: idle RSS {idle / 2**20:.0f} MiB, peak RSS {seen.peak_rss / 2**20:.0f} MiB")
        print(
            f"  memory per parked execution: {(seen.peak_rss - idle) / per / 2**20:.3f} MiB,"
            f" of which the daemon process {(seen.daemon_peak_rss - daemon_idle) / per / 2**10:.1f} KiB"
        )
        print(f"  CPU of the daemon tree: {cpu:.2f} s ({cpu / per * 1000:.2f} ms per execution)")
        print(
            f"  of which the daemon process: {seen.daemon_cpu:.2f} s ({seen.daemon_cpu / per * 1000:.2f} ms per execution)"
        )
        # Anything else on the box competes for the same cores: figures compare only when this is low.
        other = max(0.0, seen.machine_busy - cpu - client_cpu - seen.sampler_cpu)
        cpus = os.cpu_count() or 1
        print(
            f"  machine busy {100 * seen.machine_busy / seen.wall / cpus:.0f}% of {cpus} CPUs over {seen.wall:.2f} s;"
            f" other processes {100 * other / seen.wall / cpus:.0f}% (RSS sampling {seen.sampler_cpu:.2f} s)"
        )


def print_timeline(timeline: list[tuple[float, dict[int, int]]], root: int | None, client: int) -> None:
    """Each process's CPU per sample as a % of one core (ticks of 1/CLK_TCK s, so coarse), for
    the processes that used any; samples in which none did are left out."""
    used = {pid for _, ticks in timeline for pid, count in ticks.items() if count > timeline[0][1].get(pid, 0)}
    pids = sorted(used, key=lambda pid: (pid != root, pid == client, pid))
    names = [{root: "daemon", client: "client"}.get(pid, f"pid {pid}") for pid in pids]
    print(f"  CPU per {SAMPLE_S:g} s, % of one core (samples where all were idle left out):")
    print("    " + " " * 8 + "  ".join(names))
    for (_, before), (at, after) in itertools.pairwise(timeline):
        # A process that appears in a sample (a new worker) starts from its first reading.
        shares = [100 * (after.get(pid, 0) - before.get(pid, after.get(pid, 0))) / CLK_TCK / SAMPLE_S for pid in pids]
        if any(shares):
            print(
                f"    {at:6.2f}  "
                + "  ".join(f"{share:{len(name)}.0f}" for share, name in zip(shares, names, strict=True))
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--delay", type=float, default=2.0)
    parser.add_argument("--url", help="a running daemon on 127.0.0.1 (no RSS or CPU figures for it)")
    parser.add_argument("--opening", type=int, default=256, help="opening handshakes under way at once")
    parser.add_argument("--client", choices=MODES, default="raw", help="raw (default, cheapest) or websockets")
    parser.add_argument("--timeline", action="store_true", help="each process's CPU every 0.1 s")
    parser.add_argument("--daemon-arg", action="append", default=[])
    args = parser.parse_args()
    raise_nofile_limit()  # for the daemon started here, which holds the other end of every connection
    server = None if args.url else start_daemon(extra_args=args.daemon_arg)
    if server is not None:
        time.sleep(1.0)  # let the warm workers settle before measuring the idle tree
    try:
        url = args.url or server.url  # type: ignore[union-attr]
        measure(
            url, args.client, args.n, args.delay, args.opening, server.process.pid if server else None, args.timeline
        )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
