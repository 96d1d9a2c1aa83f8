"""Prometheus metrics, served at ``GET /metrics`` in the text format.

Counts and latencies come from the session's ``ExecutionEnded`` records; the
current state (sessions, pool size, worker restarts, refused handshakes) is
read at scrape time, so nothing has to be kept in step by hand. Each daemon
has its own registry.

Shards of one daemon (``supervisor.py``) share a directory: counters and
histograms go there through prometheus-client's multiprocess mode, and each
shard publishes its live state there, so ``/metrics`` from any shard is the
whole daemon's: its gauges are the shards' sums (``execbox_max_sessions`` is
the sum of the shards' shares, so it compares with ``execbox_active_sessions``
as the shards together admit).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from ...protocol.session import ExecutionEnded

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# prometheus-client's multiprocess mode: set by the supervisor for its shards.
MULTIPROCESS_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"
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
    max_sessions: int
    idle_workers: int
    busy_workers: int
    starting_workers: int
    worker_exits: dict[str, int]  # by reason (``WorkerPool.exit_reasons``)
    zygote_renewals: dict[str, int]  # by reason (``ZygoteClient.renewals``)
    refused: dict[str, int]
    draining: bool
    memory_used_bytes: int
    memory_budget_bytes: int
    log_lines_dropped: int


class _Live(Collector):
    """Gauges and counters read from the daemon's state when scraped."""

    def __init__(self, read: Callable[[], LiveState]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        state = self.read()
        yield GaugeMetricFamily("execbox_active_sessions", "Open WebSocket sessions.", value=state.sessions)
        yield GaugeMetricFamily(
            "execbox_max_sessions",
            "Most concurrent sessions admitted (--max-sessions as in force); beyond it handshakes get 503 busy.",
            value=state.max_sessions,
        )
        workers = GaugeMetricFamily("execbox_pool_workers", "Worker processes by state.", labels=["state"])
        workers.add_metric(["idle"], state.idle_workers)
        workers.add_metric(["busy"], state.busy_workers)
        workers.add_metric(["starting"], state.starting_workers)
        yield workers
        yield CounterMetricFamily(
            "execbox_worker_restarts",
            "Worker processes that exited, for any reason (each is replaced when needed).",
            value=sum(state.worker_exits.values()),
        )
        yield _by_reason(
            "execbox_worker_exits",
            "Worker processes that exited, by reason (docs: Metrics and logs).",
            state.worker_exits,
        )
        yield _by_reason(
            "execbox_zygote_renewals",
            "Zygotes replaced by a new one, with a new address-space layout, by reason (docs: Metrics and logs).",
            state.zygote_renewals,
        )
        refused = CounterMetricFamily(
            "execbox_rejected_handshakes", "Handshakes refused, by reason.", labels=["reason"]
        )
        for reason, count in state.refused.items():
            refused.add_metric([reason], count)
        yield refused
        yield GaugeMetricFamily("execbox_draining", "1 while the daemon drains.", value=1 if state.draining else 0)
        yield GaugeMetricFamily(
            "execbox_memory_used_bytes",
            "Resident memory of the daemon, its zygote and workers.",
            value=state.memory_used_bytes,
        )
        yield GaugeMetricFamily(
            "execbox_memory_budget_bytes",
            "Memory budget; near it new sessions are refused.",
            value=state.memory_budget_bytes,
        )
        yield CounterMetricFamily(
            "execbox_log_lines_dropped",
            "Log lines dropped because the log's reader fell behind (docs: Metrics and logs).",
            value=state.log_lines_dropped,
        )


def _by_reason(name: str, documentation: str, counts: dict[str, int]) -> CounterMetricFamily:
    """A counter of ``counts`` by their ``reason`` label."""
    family = CounterMetricFamily(name, documentation, labels=["reason"])
    for reason, count in sorted(counts.items()):
        family.add_metric([reason], count)
    return family


class _Unsafe(Collector):
    """``execbox_unsafe_settings{setting}``: 1 for each unsafe setting in force, 0 for the others,
    so an alert can tell a safe runner from one that does not report."""

    def __init__(self, known: Iterable[str], unsafe: Collection[str]) -> None:
        self.values = {name: 1 if name in unsafe else 0 for name in known}

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "execbox_unsafe_settings", "1 for each unsafe setting in force (see /healthz).", labels=["setting"]
        )
        for name, value in self.values.items():
            gauge.add_metric([name], value)
        yield gauge


class Metrics:
    def __init__(
        self, read_state: Callable[[], LiveState], *, known_unsafe: Iterable[str], unsafe: Collection[str]
    ) -> None:
        self.read_state = read_state
        self.unsafe = _Unsafe(known_unsafe, unsafe)
        shared = os.environ.get(MULTIPROCESS_ENV)
        self.shared_dir = Path(shared) if shared else None
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
        self.tenant_executions = Counter(
            "execbox_tenant_executions",
            "Executions that ended, by tenant (named in the tokens file, or token-N) and outcome.",
            ["tenant", "outcome"],
            registry=self.registry,
        )
        self.quota_refused_executions = Counter(
            "execbox_quota_refused_executions",
            "Executes on open sessions refused because their tenant was at a quota, by tenant and quota.",
            ["tenant", "quota"],
            registry=self.registry,
        )
        self.tenant_cpu = Counter(
            "execbox_tenant_cpu_seconds",
            "CPU the worker processes of each tenant spent (its guests' CPU), sampled each second.",
            ["tenant"],
            registry=self.registry,
        )
        # Each (outcome, code)'s counter, as ``labels`` makes it once (it checks the labels every call).
        self._by_outcome: dict[tuple[str, str], Counter] = {}
        self.tool_latency = Histogram(
            "execbox_tool_call_duration_seconds",
            "From a tool_call to its tool_result.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_Live(read_state))
        self.registry.register(self.unsafe)

    def execution_ended(self, record: ExecutionEnded, tenant: str = "") -> None:
        """Count ``record``; ``tenant``, when sessions bear tokens, labels it too (one label value per
        configured tenant, so the series stay bounded)."""
        if tenant:
            self.tenant_executions.labels(tenant, record.outcome).inc()
        key = (record.outcome, record.code or "")
        counter = self._by_outcome.get(key)
        if counter is None:
            counter = self._by_outcome[key] = self.executions.labels(*key)
        counter.inc()
        if record.outcome != "abandoned":
            self.duration.observe(record.duration_s)
        if record.tool_calls:
            self.tool_calls.inc(record.tool_calls)
        for latency in record.tool_latencies_s:
            self.tool_latency.observe(latency)

    def render(self) -> bytes:
        if self.shared_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.shared_dir))  # type: ignore[no-untyped-call]  # untyped upstream
        registry.register(_Live(self._all_shards))
        registry.register(self.unsafe)
        return generate_latest(registry)

    def publish(self) -> None:
        """Write this shard's live state for the others' /metrics (atomically: write, then rename)."""
        assert self.shared_dir is not None
        path = self.shared_dir / live_state_file(os.getpid())
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(self.read_state())))
        temporary.replace(path)

    def _all_shards(self) -> LiveState:
        assert self.shared_dir is not None
        states = [self.read_state()]
        for path in self.shared_dir.glob("live-*.json"):
            if path.name != live_state_file(os.getpid()):
                try:
                    states.append(LiveState(**json.loads(path.read_text())))
                except (OSError, ValueError, TypeError):
                    continue  # a shard that is starting or gone
        return LiveState(
            sessions=sum(s.sessions for s in states),
            max_sessions=sum(s.max_sessions for s in states),
            idle_workers=sum(s.idle_workers for s in states),
            busy_workers=sum(s.busy_workers for s in states),
            starting_workers=sum(s.starting_workers for s in states),
            worker_exits=_summed(s.worker_exits for s in states),
            zygote_renewals=_summed(s.zygote_renewals for s in states),
            refused=_summed(s.refused for s in states),
            draining=any(s.draining for s in states),
            memory_used_bytes=sum(s.memory_used_bytes for s in states),
            memory_budget_bytes=sum(s.memory_budget_bytes for s in states),
            log_lines_dropped=sum(s.log_lines_dropped for s in states),
        )


def _summed(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Counts by label, added up over shards."""
    total: dict[str, int] = {}
    for by_label in counts:
        for label, count in by_label.items():
            total[label] = total.get(label, 0) + count
    return total


def live_state_file(pid: int) -> str:
    return f"live-{pid}.json"
