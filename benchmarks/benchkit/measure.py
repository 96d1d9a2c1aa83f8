"""One load against a server, with the CPU each side spent: the load client started, let go, and read.

CPU is read from /proc around the load, so the figures say not only how many
executions per second the box managed, but where the time went (the server,
its workers, the load client, anything else on the machine).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any, Final

from .load import ID, Spec, argument
from .processes import STARTUP_TIMEOUT_S, STOP_TIMEOUT_S, Lines, popen_module
from .procfs import CLK_TCK, machine_busy_ticks, tree_cpu_seconds, wait_pool_settled
from .stats import percentile
from .workload import THROUGHPUT_CODE, execute_message

WARM_UP_S: Final = 2.0  # load before measuring, at the highest concurrency: where the worker pool grows
SAMPLE_S: Final = 0.1  # how often ``sample`` is called during a load


def run_load(load: Spec, pid: int | None = None, sample: Callable[[], None] | None = None) -> dict[str, Any]:
    """Run ``load`` in a load client process, ``sample()`` every ``SAMPLE_S`` meanwhile; the client's
    figures, and with ``pid`` (the server's) the CPU its process tree spent, per ok execution."""
    process = popen_module("load", argument(load), stdin=subprocess.PIPE)
    assert process.stdin is not None
    lines = Lines(process)
    try:
        if lines.get(STARTUP_TIMEOUT_S) != "ready\n":
            raise RuntimeError("the load client did not start")
        before = tree_cpu_seconds(pid) if pid else (0.0, 0.0, 0)
        busy0, _ = machine_busy_ticks()
        t0, cpu0 = time.monotonic(), time.process_time()
        process.stdin.write("go\n")
        process.stdin.flush()
        deadline = t0 + load.limit_s + STOP_TIMEOUT_S  # the client bounds itself to limit_s
        while (line := lines.get(SAMPLE_S)) is None:
            if sample is not None:
                sample()
            if time.monotonic() > deadline:
                raise RuntimeError("the load client overran its time limit")
        if not line:
            raise RuntimeError("the load client died")
        wall = time.monotonic() - t0
        after = tree_cpu_seconds(pid) if pid else (0.0, 0.0, 0)
        machine = (machine_busy_ticks()[0] - busy0) / CLK_TCK
        sampler = time.process_time() - cpu0
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    result: dict[str, Any] = json.loads(line)
    latencies = result.pop("latencies_ms")
    server, workers, client = after[0] - before[0], after[1] - before[1], result["cpu_s"]
    cpus = os.cpu_count() or 1
    ok = max(result["ok"], 1)
    return result | {
        "concurrency": load.concurrency,
        "executions_per_s": result["completed"] / load.duration if math.isfinite(load.duration) else math.nan,
        "failures": result["refused"] + result["failed"],
        "latency_median_ms": percentile(latencies, 0.5),
        "latency_p95_ms": percentile(latencies, 0.95),
        "wall_s": wall,
        "server_cpu_s": server,
        "workers_cpu_s": workers,
        "machine_busy_s": machine,
        "sampler_cpu_s": sampler,
        "live_workers": after[2],
        "server_us": server / ok * 1e6,
        "workers_us": workers / ok * 1e6,
        "tree_us": (server + workers) / ok * 1e6,
        "client_us": client / ok * 1e6,
        "machine_busy_pct": 100 * machine / wall / cpus,
        # Anything else on the box competes for the same cores: figures compare only when this is low.
        "other_pct": 100 * max(0.0, machine - server - workers - client - sampler) / wall / cpus,
    }


def throughput(
    url: str, pid: int, concurrency: int, duration: float, code: str = THROUGHPUT_CODE, expect: Any = 2
) -> dict[str, Any]:
    """``code`` at ``concurrency`` for ``duration`` seconds, a fresh connection per execution."""
    execute = execute_message(ID, code).decode()
    return run_load(Spec(url, execute, expect, concurrency, duration, limit_s=duration + 10), pid)


def warm_up(url: str, pid: int, concurrency: int) -> None:
    """``1+1`` at ``concurrency`` (where the worker pool grows), then wait for the pool to settle."""
    throughput(url, pid, concurrency, WARM_UP_S)
    wait_pool_settled(pid)


def line(label: str, result: dict[str, Any]) -> str:
    """One load's figures on one line."""
    failures = f"; FAILURES {result['failures']}: {result['failure_reasons']}" if result["failures"] else ""
    return (
        f"  {label:<22} c={result['concurrency']:<3} {result['executions_per_s']:7.1f} exec/s, median "
        f"{result['latency_median_ms']:6.2f} ms; CPU per execution: server {result['server_us']:5.0f} us + workers "
        f"{result['workers_us']:5.0f} us = {result['tree_us']:5.0f} us, client {result['client_us']:4.0f} us; "
        f"machine busy {result['machine_busy_pct']:.0f}% (others {result['other_pct']:.0f}%){failures}"
    )
