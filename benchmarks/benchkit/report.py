"""Where figures go: human-readable lines for people, and a summary dict for ``--json``.

Kept apart from the measuring so both views are built from the same numbers.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from .stats import LatencyStats


@dataclass
class Report:
    """Lines to ``out`` as they are measured (so a long run shows progress) and figures into ``summary``."""

    out: TextIO = sys.stdout
    summary: dict[str, Any] = field(default_factory=dict)

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)


def fmt_ms(value: float) -> str:
    return f"{value:8.3f} ms"


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def latency_line(stats: LatencyStats) -> str:
    """One human-readable latency result."""
    fail = f"  FAILURES: {stats.failures} {stats.failure_examples}" if stats.failures else ""
    return f"  {stats.name:<26} median {fmt_ms(stats.median)}   p95 {fmt_ms(stats.p95)}   (n={len(stats.samples_ms)}){fail}"


def throughput_line(result: dict[str, Any]) -> str:
    """One human-readable throughput result (four lines when CPU figures are known)."""
    fail = f"  FAILURES {result['failures']} {result['failure_examples']}" if result["failures"] else ""
    median, p95 = (result[k] if result[k] is not None else math.nan for k in ("latency_median_ms", "latency_p95_ms"))
    text = (
        f"  c={result['concurrency']:<3} {result['executions_per_s']:8.1f} exec/s   median {median:7.2f} ms"
        f"   p95 {p95:7.2f} ms   ({result['client_processes']} {result['client_mode']} client proc){fail}"
    )
    if "daemon_plus_workers_cpu_s" in result:
        text += (
            f"\n         CPU per execution: daemon {result['daemon_us_per_exec']} us + workers {result['workers_us_per_exec']} us"
            f" = {result['daemon_plus_workers_us_per_exec']} us; load client {result['client_cpu_us_per_exec']} us"
            f"\n         daemon process busy {100 * result['daemon_cores_used']:.0f}% of a core; machine busy {result['machine_busy_pct']}%"
            f" (other processes {result['other_cpu_pct']}%); live workers {result['live_workers_after']}"
            f"\n         CPU-bound capacity estimate (idle box, same client): {result.get('capacity_estimate_per_s')} exec/s"
        )
    return text
