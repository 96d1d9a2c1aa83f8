"""One throughput level: load client processes started together, and the CPU each side spent.

CPU is read around the window from /proc, so the figures say not only how
many executions per second the box managed, but where the time went (daemon,
workers, load client, anything else) and what an idle box could do.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any, Final

from .client import IO_TIMEOUT_S
from .processes import popen_module
from .procfs import CLK_TCK, machine_busy_ticks, tree_cpu_seconds, wait_pool_settled
from .stats import number, percentile
from .workload import THROUGHPUT_CODE

WARM_UP_S: Final = 2.0  # the load before a measurement, at its highest concurrency: where the pool grows


def run_throughput(
    url: str, mode: str, concurrency: int, duration: float, processes: int, code: str, daemon_pid: int | None
) -> dict[str, Any]:
    """Throughput at ``concurrency`` split over ``processes`` client processes, with CPU shares."""
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    clients = [
        popen_module("load_client", mode, url, str(share), str(duration), code, stdin=subprocess.PIPE)
        for share in shares
    ]
    results: list[dict[str, Any]] = []
    try:
        for client in clients:
            assert client.stdout is not None
            if client.stdout.readline().strip() != "ready":
                raise RuntimeError("load client failed to start")
        before = tree_cpu_seconds(daemon_pid) if daemon_pid else None
        busy0, total0 = machine_busy_ticks()
        t0 = time.perf_counter()
        for client in clients:
            assert client.stdin is not None
            client.stdin.write("go\n")
            client.stdin.flush()
        for client in clients:
            assert client.stdout is not None
            line = client.stdout.readline()
            if not line:
                raise RuntimeError("load client died")
            results.append(json.loads(line))
        wall = time.perf_counter() - t0
        after = tree_cpu_seconds(daemon_pid) if daemon_pid else None
        busy1, total1 = machine_busy_ticks()
    finally:
        for client in clients:
            try:
                client.wait(timeout=duration + IO_TIMEOUT_S + 5)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()
    latencies = [x for r in results for x in r["latencies_ms"]]
    completed = sum(r["completed"] for r in results)
    client_cpu = sum(r["cpu_s"] for r in results)
    # CPU is measured until the last in-flight execution ends, so it is shared
    # over every execution that succeeded, not only those inside the window.
    served = sum(r["succeeded_total"] for r in results)
    out: dict[str, Any] = {
        "concurrency": concurrency,
        "client_processes": processes,
        "client_mode": mode,
        "duration_s": duration,
        "completed": completed,
        "executions_per_s": round(completed / duration, 1),
        "failures": sum(r["failures"] for r in results),
        "failure_examples": [e for r in results for e in r["failure_examples"]][:3],
        "latency_median_ms": number(percentile(latencies, 0.5), 3),
        "latency_p95_ms": number(percentile(latencies, 0.95), 3),
        "client_cpu_s": round(client_cpu, 3),
        "client_cpu_us_per_exec": _per_exec(client_cpu, served),
        "machine_busy_pct": round(100 * (busy1 - busy0) / max(1, total1 - total0), 1),
        "window_s": round(wall, 3),
    }
    if before and after:
        machine_s = (busy1 - busy0) / CLK_TCK
        out |= _daemon_cpu(before, after, wall, served, client_cpu, machine_s)
    return out


def _daemon_cpu(
    before: tuple[float, float, int],
    after: tuple[float, float, int],
    wall: float,
    served: int,
    client_cpu: float,
    machine_s: float,
) -> dict[str, Any]:
    """The daemon's and its workers' share of the CPU, per execution, and the capacity it implies."""
    daemon_cpu = after[0] - before[0]
    workers_cpu = after[1] - before[1]
    total = daemon_cpu + workers_cpu
    cpus = os.cpu_count() or 1
    out: dict[str, Any] = {
        "daemon_plus_workers_cpu_s": round(total, 3),
        "daemon_cpu_s": round(daemon_cpu, 3),
        "workers_cpu_s": round(workers_cpu, 3),
        "daemon_plus_workers_us_per_exec": _per_exec(total, served),
        "daemon_us_per_exec": _per_exec(daemon_cpu, served),
        "workers_us_per_exec": _per_exec(workers_cpu, served),
        "daemon_cores_used": round(daemon_cpu / wall, 2),
    }
    if served:
        # What this box could do with nothing else running: all CPUs shared by daemon, workers
        # and this load client, and the single-threaded daemon limited to one core.
        out["capacity_estimate_per_s"] = round(
            min(cpus / ((total + client_cpu) / served), 1 / max(daemon_cpu / served, 1e-9))
        )
    out["live_workers_after"] = after[2]
    out["other_cpu_pct"] = round(100 * max(0.0, machine_s - total - client_cpu) / wall / cpus, 1)
    return out


def _per_exec(seconds: float, served: int) -> float | None:
    """Microseconds per served execution; None when none was served."""
    return round(seconds / served * 1e6, 1) if served else None


def settled_throughput(url: str, daemon_pid: int, levels: list[int], duration: float) -> dict[int, dict[str, Any]]:
    """``1+1`` (a fresh connection per execution) at each concurrency of ``levels`` for ``duration``
    seconds, against a daemon just started: after a warm-up at the highest, once its pool has settled."""
    run_throughput(url, "raw", max(levels), WARM_UP_S, 1, THROUGHPUT_CODE, daemon_pid)
    wait_pool_settled(daemon_pid)
    return {level: run_throughput(url, "raw", level, duration, 1, THROUGHPUT_CODE, daemon_pid) for level in levels}
