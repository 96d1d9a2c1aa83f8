"""What one benchmark run is asked to do, resolved from the command line (``--quick`` already applied)."""

from __future__ import annotations

from dataclasses import dataclass, field

SECTIONS = ("latency", "throughput", "cpu")


@dataclass(frozen=True)
class Settings:
    """One run: which daemon, which sections, and how long each measures."""

    iterations: int  # executions per latency measurement
    duration: float  # seconds per throughput level
    cpu_iterations: int  # CPU-bound guest executions
    levels: list[int]  # throughput concurrency levels
    sections: frozenset[str] = frozenset(SECTIONS)
    load_client: str = "raw"  # raw | sansio, see benchkit.load_client
    client_procs: int = 1  # load client processes for concurrency >= 16
    url: str | None = None  # a running daemon instead of one started here
    daemon_pid: int | None = None  # with url: the daemon's PID, for CPU accounting
    warm_workers: int | None = None
    daemon_args: list[str] = field(default_factory=list)
    json: bool = False  # JSON summary on stdout, the report on stderr
