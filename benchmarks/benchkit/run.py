"""One benchmark run: start the servers it needs, run the chosen sections, always stop what it started."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Final

from websockets.uri import parse_uri

from .baselines import start_echo_server
from .processes import Server, start_daemon
from .report import Report
from .sections import cpu_section, latency_section, throughput_section
from .settings import Settings

ECHO_SERVER: Final = "websockets Sans-I/O ServerProtocol over trio (subprocess)"
LATENCY_CLIENT: Final = "websockets Sans-I/O ClientProtocol over a blocking socket"


def run(settings: Settings) -> int:
    """The whole benchmark; the exit status (1 if any execution failed)."""
    report = Report(sys.stderr if settings.json else sys.stdout)
    servers: list[Server] = []
    failures = 0
    started = time.perf_counter()
    try:
        url, daemon_pid = settings.url, settings.daemon_pid
        if url is None:
            daemon = start_daemon(settings.warm_workers, settings.daemon_args)
            servers.append(daemon)
            url, daemon_pid = daemon.url, daemon.process.pid
        uri = parse_uri(url)
        _header(settings, url, daemon_pid, report)
        if "latency" in settings.sections:
            echo = start_echo_server()
            servers.append(echo)
            failures += latency_section(uri, parse_uri(echo.url), settings.iterations, report)
            echo.stop()
        if "throughput" in settings.sections and settings.levels:
            failures += throughput_section(url, settings, daemon_pid, report)
        if "cpu" in settings.sections:
            failures += cpu_section(uri, settings.cpu_iterations, report)
        report.summary["total_failures"] = failures
        report.summary["elapsed_s"] = round(time.perf_counter() - started, 1)
        report.say(f"\nfailed executions: {failures}; elapsed {report.summary['elapsed_s']} s")
    finally:
        for server in reversed(servers):
            server.stop()
    if settings.json:
        print(json.dumps(report.summary, indent=2))
    return 1 if failures else 0


def _header(settings: Settings, url: str, daemon_pid: int | None, report: Report) -> None:
    """What was measured, against what, on which machine under which load: the run's context."""
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    report.say(
        f"execbox-runner benchmark: daemon {url} (pid {daemon_pid}); {os.cpu_count()} CPUs, load average {' '.join(load)}"
    )
    report.say(f"  latency client: {LATENCY_CLIENT}; load client: {settings.load_client}")
    report.say(
        f"  iterations {settings.iterations}, throughput {settings.duration:g} s per level at {settings.levels}, "
        f"cpu-bound runs {settings.cpu_iterations}"
    )
    report.summary["config"] = {
        "url": url,
        "iterations": settings.iterations,
        "duration_s": settings.duration,
        "levels": settings.levels,
        "sections": sorted(settings.sections),
        "client_procs": settings.client_procs,
        "warm_workers": settings.warm_workers,
        "daemon_args": settings.daemon_args,
        "cpus": os.cpu_count(),
        "loadavg_at_start": load,
        "echo_server": ECHO_SERVER,
        "latency_client": LATENCY_CLIENT,
        "load_client": settings.load_client,
    }
