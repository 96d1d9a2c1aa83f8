"""The daemon under the soak, watched every second: alive, ``/healthz`` answering, its tree's memory."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final

from websockets.uri import parse_uri

from .host import Tally, Violation

HEALTH_TIMEOUT_S: Final = 5.0
SAMPLE_EVERY_S: Final = 1.0
SETTLE_S: Final = 15.0  # after the load, for the daemon to close every session
PAGE_BYTES: Final = os.sysconf("SC_PAGE_SIZE")
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
MiB: Final = 1 << 20


def healthz(url: str) -> dict[str, Any]:
    """``GET /healthz``; raises ``Violation`` on anything but a 200 with ``status: alive``."""
    uri = parse_uri(url)
    connection = http.client.HTTPConnection(uri.host, uri.port, timeout=HEALTH_TIMEOUT_S)
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise Violation(f"/healthz did not answer: {type(exc).__name__}: {exc}") from None
    finally:
        connection.close()
    try:
        report = json.loads(body)
    except ValueError:
        report = {}
    if response.status != 200 or not isinstance(report, dict) or report.get("status") != "alive":
        raise Violation(f"/healthz answered {response.status} {body[:200]!r}")
    return report


def _stat(pid: str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    fields = _stat(str(pid))
    return fields is not None and fields[0] != "Z"


@dataclass
class Tree:
    """``root`` and every process below it: resident bytes, how many processes below, CPU seconds
    (those of reaped children included)."""

    resident: int
    processes: int
    cpu_s: float


def tree(root: int) -> Tree:
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(entry)) is not None:
            stats[int(entry)] = fields
    members, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, fields in stats.items() if int(fields[1]) == parent and pid not in members]
        members.update(children)
        frontier += children
    resident = 0
    for pid in members:
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{pid}/statm") as statm:
            resident += int(statm.read().split()[1]) * PAGE_BYTES
    ticks = sum(sum(map(int, stats[pid][11:15])) for pid in members if pid in stats)
    return Tree(resident, len(members) - 1, ticks / CLK_TCK)


@dataclass
class Watch:
    """Samples taken every second: (seconds into the run, tree RSS), processes, and health latencies."""

    url: str
    pid: int
    tally: Tally
    t0: float
    rss: list[tuple[float, int]] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)  # live processes under the daemon
    health_ms: list[float] = field(default_factory=list)
    dead: threading.Event = field(default_factory=threading.Event)

    def once(self) -> None:
        if not alive(self.pid):
            self.tally.violation("daemon", f"process {self.pid} is gone")
            self.dead.set()
            return
        now = tree(self.pid)
        self.rss.append((time.monotonic() - self.t0, now.resident))
        self.processes.append(now.processes)
        started = time.perf_counter()
        try:
            healthz(self.url)
        except Violation as exc:
            self.tally.violation("healthz", str(exc))
        self.health_ms.append((time.perf_counter() - started) * 1000)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(SAMPLE_EVERY_S) and not self.dead.is_set():
            self.once()


def slope_mib_per_min(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of RSS over time, MiB a minute (NaN for fewer than 2 points)."""
    if len(points) < 2:
        return float("nan")
    mean_t = sum(t for t, _ in points) / len(points)
    mean_r = sum(r for _, r in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return float("nan")
    return sum((t - mean_t) * (r - mean_r) for t, r in points) / spread * 60 / MiB


def settle(url: str, tally: Tally) -> int | None:
    """After the load, wait (bounded) until ``/healthz`` shows no session five times in a row; the last count."""
    zeros, sessions, end = 0, None, time.monotonic() + SETTLE_S
    while time.monotonic() < end and zeros < 5:
        try:
            report = healthz(url)
        except Violation as exc:
            tally.violation("healthz", str(exc))
            return None
        sessions = report.get("sessions")
        if not isinstance(sessions, int):
            tally.violation("healthz", f"/healthz has no session count: {report}")
            return None
        zeros = zeros + 1 if sessions == 0 else 0
        time.sleep(0.2)
    if zeros < 5:
        tally.violation("sessions", f"/healthz still counts {sessions} sessions {SETTLE_S:g} s after the load stopped")
    return sessions
