"""Prometheus metrics, served at ``GET /metrics`` in the text format.

Counts and latencies come from the session's ``ExecutionEnded`` records; the
current state (sessions, pool size, worker restarts, refused handshakes) is
read at scrape time, so nothing has to be kept in step by hand. Each daemon
has its own registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..protocol.session import ExecutionEnded

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


@dataclass(frozen=True, slots=True)
class LiveState:
    """What the daemon reports at scrape time."""

    sessions: int
    idle_workers: int
    busy_workers: int
    starting_workers: int
    worker_exits: int
    refused: dict[str, int]
    draining: bool


class _Live(Collector):
    """Gauges and counters read from the daemon's state when scraped."""

    def __init__(self, read: Callable[[], LiveState]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        state = self.read()
        yield GaugeMetricFamily("execbox_active_sessions", "Open WebSocket sessions.", value=state.sessions)
        workers = GaugeMetricFamily("execbox_pool_workers", "Worker processes by state.", labels=["state"])
        workers.add_metric(["idle"], state.idle_workers)
        workers.add_metric(["busy"], state.busy_workers)
        workers.add_metric(["starting"], state.starting_workers)
        yield workers
        yield CounterMetricFamily(
            "execbox_worker_restarts", "Worker processes that exited and were replaced.", value=state.worker_exits
        )
        refused = CounterMetricFamily(
            "execbox_rejected_handshakes", "Handshakes refused, by reason.", labels=["reason"]
        )
        for reason, count in state.refused.items():
            refused.add_metric([reason], count)
        yield refused
        yield GaugeMetricFamily("execbox_draining", "1 while the daemon drains.", value=1 if state.draining else 0)


class Metrics:
    def __init__(self, read_state: Callable[[], LiveState]) -> None:
        self.registry = CollectorRegistry()
        self.executions = Counter(
            "execbox_executions",
            "Executions by outcome (ok, error, abandoned) and error code.",
            ["outcome", "code"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "execbox_execution_duration_seconds",
            "Execution wall time, started to done.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tool_calls = Counter("execbox_tool_calls", "Tool calls sent to hosts.", registry=self.registry)
        self.tool_latency = Histogram(
            "execbox_tool_call_duration_seconds",
            "From a tool_call to its tool_result.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Live(read_state))

    def execution_ended(self, record: ExecutionEnded) -> None:
        self.executions.labels(record.outcome, record.code or "").inc()
        if record.outcome != "abandoned":
            self.duration.observe(record.duration_s)
        self.tool_calls.inc(record.tool_calls)
        for latency in record.tool_latencies_s:
            self.tool_latency.observe(latency)

    def render(self) -> bytes:
        return generate_latest(self.registry)
