"""The soak's run: client threads and sentinels against one daemon, then its report."""

from __future__ import annotations

import functools
import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from websockets.exceptions import InvalidStatus

from .host import IO_TIMEOUT_S, Host, Session, Tally, Violation
from .mix import SESSIONS, park_long
from .watch import MiB, Watch, settle, slope_mib_per_min, tree

SESSION_LIMIT_S: Final = 45.0  # no session of the mix needs more; each read is bounded by IO_TIMEOUT_S too
# A sentinel's tool answers this late: longer than the daemon's abort grace (2.5 s) plus the 30 s after
# which it kills a worker still stuck in an aborted execution, with every execution that worker hosts.
PARK_S: Final = 40.0
PROGRESS_EVERY_S: Final = 10.0
IDLE_S: Final = 3.0  # after the load: how long the tree's idle CPU is measured


@dataclass(frozen=True)
class Settings:
    duration_s: float
    clients: int
    sentinels: int
    seed: int
    kinds: list[str]
    shown: int = 10
    tokens: tuple[str, ...] = ()  # each client and sentinel bears one, in turn: tenants side by side

    def token(self, index: int) -> str | None:
        return self.tokens[index % len(self.tokens)] if self.tokens else None


def run_session(
    kind: str, body: Callable[[Session, Host], None], s: Session, url: str, limit_s: float = SESSION_LIMIT_S
) -> None:
    """One session of ``kind``; a broken invariant is counted and described, never raised."""
    s.tally.count(s.tally.sessions, kind)
    host: Host | None = None
    try:
        host = Host(url, s.tally, time.monotonic() + limit_s, s.token)
        body(s, host)
    except InvalidStatus as exc:
        if exc.response.status_code == 503:  # the daemon is full: a documented answer
            with s.tally.lock:
                s.tally.refused += 1
            time.sleep(0.1)
            return
        s.tally.count(s.tally.session_violations, kind)
        s.tally.violation(f"{kind} {s.prefix}", f"handshake refused: {exc}")
    except (Violation, OSError, ValueError) as exc:  # also a reset by the runner, a protocol error
        detail = str(exc) if isinstance(exc, Violation) else f"{type(exc).__name__}: {exc}"
        s.tally.count(s.tally.session_violations, kind)
        s.tally.violation(f"{kind} {s.prefix}", f"{detail}; last frames: {host and host.transcript}")
    finally:
        if host is not None:
            host.connection.socket.close()


def client_loop(index: int, url: str, settings: Settings, end: float, stop: threading.Event, tally: Tally) -> None:
    """Sessions drawn from the seeded mix of ``settings.kinds``, back to back, until ``end``."""
    rng = random.Random(f"{settings.seed}:{index}")
    weights = [SESSIONS[kind][0] for kind in settings.kinds]
    number = 0
    while time.monotonic() < end and not stop.is_set():
        kind = rng.choices(settings.kinds, weights)[0]
        run_session(kind, SESSIONS[kind][1], Session(rng, f"c{index}s{number}", tally, settings.token(index)), url)
        number += 1


def sentinel_loop(index: int, url: str, start: float, end: float, tally: Tally, token: str | None) -> None:
    """Executions parked for up to ``PARK_S`` each, back to back from ``start`` until ``end``."""
    time.sleep(max(start - time.monotonic(), 0.0))
    number = 0
    while (left := end - time.monotonic()) > 5.0:
        seconds = min(PARK_S, left)
        session = Session(random.Random(index), f"p{index}s{number}", tally, token)
        run_session(
            "parked_long", functools.partial(park_long, seconds=seconds), session, url, seconds + SESSION_LIMIT_S
        )
        number += 1


def soak(url: str, pid: int, settings: Settings, say: Callable[[str], None]) -> Tally:
    """Run the soak against the daemon at ``url`` (process ``pid``); ``say`` its progress and report."""
    tally = Tally(shown=settings.shown)
    t0 = time.monotonic()
    watch = Watch(url, pid, tally, t0)
    watch.once()
    end = t0 + settings.duration_s
    stop = threading.Event()
    threads = [
        threading.Thread(target=client_loop, args=(i, url, settings, end, stop, tally), daemon=True)
        for i in range(settings.clients)
    ]
    threads += [
        threading.Thread(
            target=sentinel_loop,
            args=(i, url, t0 + i * PARK_S / max(settings.sentinels, 1), end, tally, settings.token(i)),
            daemon=True,
        )
        for i in range(settings.sentinels)
    ]
    say(f"soak: {settings}, daemon pid {pid}")
    watcher = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    watcher.start()
    for thread in threads:
        thread.start()
    while time.monotonic() < end and not watch.dead.is_set():
        time.sleep(min(PROGRESS_EVERY_S, max(end - time.monotonic(), 0.0)))
        rss = f", tree RSS {watch.rss[-1][1] / MiB:.0f} MiB" if watch.rss else ""
        say(
            f"  {time.monotonic() - t0:5.0f} s: {sum(tally.sessions.values())} sessions, {tally.violations} violations{rss}"
        )
    stop.set()
    joined_by = time.monotonic() + PARK_S + SESSION_LIMIT_S + IO_TIMEOUT_S  # a session's limit plus one read
    for thread in threads:
        thread.join(timeout=max(joined_by - time.monotonic(), 0.0))
    if stuck := sum(thread.is_alive() for thread in threads):
        tally.violation("soak", f"{stuck} client threads still running after the load stopped")
    watcher.join(timeout=2 * IO_TIMEOUT_S)
    wall = time.monotonic() - t0
    sessions_left = settle(url, tally) if not watch.dead.is_set() else None
    idle = float("nan")
    if not watch.dead.is_set():
        before = tree(pid).cpu_s
        time.sleep(IDLE_S)
        idle = (tree(pid).cpu_s - before) / IDLE_S * 100
        watch.once()  # the end figures, after the load
    for line in report(tally, watch, settings, wall, sessions_left, idle):
        say(line)
    return tally


def report(
    tally: Tally, watch: Watch, settings: Settings, wall: float, sessions_left: int | None, idle: float
) -> list[str]:
    """The soak's figures: sessions by kind, outcomes, latencies, the tree's memory, the violations."""
    total = sum(tally.sessions.values())
    lines = [f"sessions: {total} in {wall:.0f} s ({total / wall:.1f}/s), refused (503): {tally.refused}"]
    lines += [f"  {k:<16} {n:6}   violations {tally.session_violations[k]}" for k, n in sorted(tally.sessions.items())]
    lines.append("variants: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.variants.items())))
    lines.append("dones by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.dones.items())))
    lines.append("latency (ms):")
    lines += [spread(name, ms) for name, ms in sorted({**tally.samples_ms, "GET /healthz": watch.health_ms}.items())]
    if watch.rss:
        sizes = [r for _, r in watch.rss]
        half = [(t, r) for t, r in watch.rss if settings.duration_s / 2 <= t <= settings.duration_s]
        lines.append(
            f"tree RSS (daemon, zygotes, workers): start {sizes[0] / MiB:.0f} MiB, peak {max(sizes) / MiB:.0f} MiB,"
            f" end {sizes[-1] / MiB:.0f} MiB (after the load); slope over the second half"
            f" {slope_mib_per_min(half):+.2f} MiB/min ({len(half)} samples)"
        )
        lines.append(
            f"processes under the daemon: start {watch.processes[0]}, peak {max(watch.processes)},"
            f" end {watch.processes[-1]}; tree CPU after the load {idle:.1f}% of a core"
        )
    lines.append(f"sessions open after the load (/healthz): {sessions_left}")
    lines.append(f"violations: {tally.violations}")
    return lines + [f"  {line}" for line in tally.described]


def spread(name: str, ms: list[float]) -> str:
    """Median, 99th percentile and maximum of ``ms``."""
    if len(ms) < 2:
        return f"  {name:<36} {len(ms)} samples"
    p99 = statistics.quantiles(ms, n=100, method="inclusive")[98]
    return f"  {name:<36} n={len(ms):<5} p50 {statistics.median(ms):7.1f}  p99 {p99:7.1f}  max {max(ms):7.1f} ms"
