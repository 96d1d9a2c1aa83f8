"""An execution's OpenTelemetry spans, made from its session's record once it has ended.

One span per execution (``execbox.execution``, from ``execute`` to ``done``), a child span per tool
call (``execbox.tool_call``, from ``tool_call`` to ``tool_result``; one never answered ends with the
execution), and events for a cancel, a timeout, a memory limit and a lost worker. A ``traceparent``
from the host's handshake makes the execution span a child of the host's span, carrying on its
``tracestate``. The spans are made after the fact from the times the session kept, so a traced
execution costs nothing while it runs. Attributes never hold a token or the guest's code: its size, the tenant's label, the worker's PID.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Final

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ... import __version__
from ...protocol.session import ExecutionEnded
from .logs import clipped

_NS: Final = 1_000_000_000
_EVENTS: Final = {"timeout": "execbox.timeout", "memory_limit": "execbox.memory_limit"}


class ExecutionSpans:
    """The daemon's tracer: ``record`` each ended execution; ``shutdown`` sends what is left. The SDK
    reads its settings (``OTEL_*``) from the process's environment."""

    def __init__(self) -> None:
        self._provider = TracerProvider(resource=_resource())
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # OTEL_EXPORTER_OTLP_*
        self._tracer = self._provider.get_tracer("execbox_runner", __version__)
        self._propagator = TraceContextTextMapPropagator()

    def record(
        self,
        record: ExecutionEnded,
        *,
        trace_context: Mapping[str, str],
        tenant: str,
        worker_pid: int | None,
        worker_lost: bool,
    ) -> None:
        """The spans of one ended execution; it ended now."""
        ended = time.time_ns()
        started = ended - round(record.duration_s * _NS)
        parent = self._propagator.extract(trace_context) if trace_context else None
        attributes: dict[str, str | int | float | bool] = {
            "execbox.execution_id": clipped(record.id),
            "execbox.outcome": record.outcome,
            "execbox.code_bytes": len(record.guest_code.encode("utf-8", "surrogatepass")),
            "execbox.tool_calls": record.tool_calls,
            "execbox.duration_ms": round(record.duration_s * 1000, 3),
        }
        if record.code is not None:
            attributes["execbox.error_code"] = record.code
        if tenant:
            attributes["execbox.tenant"] = tenant
        if worker_pid is not None:
            attributes["execbox.worker_pid"] = worker_pid
        span = self._tracer.start_span("execbox.execution", parent, SpanKind.SERVER, attributes, start_time=started)
        inside = trace.set_span_in_context(span)
        for call_id, name, after_s, took_s in record.tool_call_times:
            call_started = started + round(after_s * _NS)
            call = self._tracer.start_span(
                "execbox.tool_call",
                inside,
                SpanKind.INTERNAL,
                {"execbox.call_id": call_id, "execbox.tool": name, "execbox.answered": took_s is not None},
                start_time=call_started,
            )
            call.end(ended if took_s is None else call_started + round(took_s * _NS))
        if record.cancelled_after_s is not None:
            span.add_event("execbox.cancel", timestamp=started + round(record.cancelled_after_s * _NS))
        if worker_lost:  # which ends the execution at once
            span.add_event("execbox.worker_lost", timestamp=ended)
        if record.code in _EVENTS and not (record.code == "timeout" and record.cancelled_after_s is not None):
            span.add_event(_EVENTS[record.code], timestamp=ended)
        if record.outcome != "ok":
            span.set_status(Status(StatusCode.ERROR, record.code or record.outcome))
        span.end(ended)

    def shutdown(self) -> None:
        """Send the spans not yet sent (bounded by the exporter's own timeout)."""
        self._provider.shutdown()


def _resource() -> Resource:
    """The resource of ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME``, named ``execbox-runner``
    only when neither names the service (the SDK would say ``unknown_service``)."""
    configured = Resource.create()
    if str(configured.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        return configured.merge(Resource({SERVICE_NAME: "execbox-runner"}))
    return configured
