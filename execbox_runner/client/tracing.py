"""Host-side OpenTelemetry spans, when OpenTelemetry's API is installed (the ``otel`` extra, or your
application's own): one span per execution (``execbox.execute``) whose ``traceparent`` goes to the
runner in the handshake, so the runner's spans join the same trace, and one per tool the host runs
(``execbox.tool``). Which tracer provider records them is the application's choice, as OpenTelemetry
has it; without one they cost next to nothing. Without the package, nothing is imported.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator
from typing import Any


@functools.cache
def _api() -> Any | None:
    """OpenTelemetry's ``trace`` and ``propagate`` modules, or None when it is not installed."""
    if importlib.util.find_spec("opentelemetry") is None:
        return None
    from opentelemetry import propagate, trace  # noqa: PLC0415 - optional, and only once asked for

    return trace, propagate


@contextlib.contextmanager
def execution_span(execution_id: str) -> Iterator[tuple[tuple[str, str], ...]]:
    """A span for one execution, current inside the block; yields the handshake headers that carry
    its context (``traceparent``, and ``tracestate`` when there is one; none without a recording span)."""
    api = _api()
    if api is None:
        yield ()
        return
    trace, propagate = api
    tracer = trace.get_tracer("execbox_runner.client")
    with tracer.start_as_current_span(
        "execbox.execute", kind=trace.SpanKind.CLIENT, attributes={"execbox.execution_id": execution_id}
    ):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield tuple(carrier.items())


def finished(ok: bool, error_code: str | None) -> None:
    """Mark the current execution span with the outcome."""
    api = _api()
    if api is None:
        return
    trace, _ = api
    span = trace.get_current_span()
    span.set_attribute("execbox.outcome", "ok" if ok else "error")
    if error_code is not None:
        span.set_attribute("execbox.error_code", error_code)
        span.set_status(trace.Status(trace.StatusCode.ERROR, error_code))


@contextlib.contextmanager
def tool_span(provider: str, tool: str) -> Iterator[None]:
    """A span for one tool the host runs, a child of the execution's."""
    api = _api()
    if api is None:
        yield
        return
    trace, _ = api
    with trace.get_tracer("execbox_runner.client").start_as_current_span(
        "execbox.tool", attributes={"execbox.tool": f"{provider}.{tool}"}
    ):
        yield
