"""Latency samples and the few statistics the report shows."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

FAILURE_EXAMPLES = 3  # enough to diagnose a failing run without flooding the report


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) with linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def number(value: float, digits: int = 4) -> float | None:
    """``value`` rounded for JSON, None for NaN."""
    return None if math.isnan(value) else round(value, digits)


def spread(ms: list[float], bound_ms: float | None = None) -> str:
    """Milliseconds summed up: how many, median, p95, p99, max (and how many over ``bound_ms``)."""
    if not ms:
        return "no samples"
    text = f"n={len(ms):<5} median {percentile(ms, 0.5):7.2f}  p95 {percentile(ms, 0.95):7.2f}"
    text += f"  p99 {percentile(ms, 0.99):7.2f}  max {max(ms):7.2f} ms"
    return text + (f"  (over {bound_ms:g} ms: {sum(m > bound_ms for m in ms)})" if bound_ms is not None else "")


@dataclass
class LatencyStats:
    """Latencies of one measurement, in milliseconds, and its failures (counted, a few kept)."""

    name: str
    samples_ms: list[float] = field(default_factory=list)
    failures: int = 0
    failure_examples: list[str] = field(default_factory=list)

    def fail(self, detail: str) -> None:
        self.failures += 1
        if len(self.failure_examples) < FAILURE_EXAMPLES:
            self.failure_examples.append(detail[:300])

    @property
    def median(self) -> float:
        return percentile(self.samples_ms, 0.5)

    @property
    def p95(self) -> float:
        return percentile(self.samples_ms, 0.95)

    def summary(self) -> dict[str, Any]:
        """JSON-ready figures (None where there were no samples)."""
        return {
            "n": len(self.samples_ms),
            "median_ms": number(self.median),
            "p95_ms": number(self.p95),
            "mean_ms": number(statistics.fmean(self.samples_ms)) if self.samples_ms else None,
            "failures": self.failures,
            "failure_examples": self.failure_examples,
        }


class LoadTally:
    """What one load client counts: latencies inside the window, every success (for CPU shares), failures, its CPU."""

    def __init__(self, duration: float) -> None:
        self.deadline = time.monotonic() + duration  # end of the measured window
        self.stats = LatencyStats("load")
        self.succeeded = 0
        self.cpu0 = time.process_time()
        self.wall0 = time.perf_counter()

    def in_window(self) -> bool:
        return time.monotonic() < self.deadline

    def record(self, outcome: str, elapsed_s: float) -> None:
        """One finished execution: ``outcome`` is empty on success, else what went wrong."""
        if outcome:
            self.stats.fail(outcome)
        else:
            self.succeeded += 1
            if time.monotonic() <= self.deadline:
                self.stats.samples_ms.append(elapsed_s * 1000)

    def result(self) -> dict[str, Any]:
        """What a load client reports back to the benchmark process, as JSON."""
        return {
            "completed": len(self.stats.samples_ms),
            "succeeded_total": self.succeeded,
            "failures": self.stats.failures,
            "failure_examples": self.stats.failure_examples,
            "latencies_ms": self.stats.samples_ms,
            "cpu_s": time.process_time() - self.cpu0,
            "wall_s": time.perf_counter() - self.wall0,
        }
