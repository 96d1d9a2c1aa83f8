"""Whether executions are traced: OpenTelemetry, when the ``otel`` extra is installed and the
standard ``OTEL_*`` variables ask for traces.

Traces are on when ``OTEL_TRACES_EXPORTER`` (``otlp``, the one exporter made) or an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, unless
``OTEL_SDK_DISABLED`` is ``true`` or the exporter is ``none``. Otherwise nothing of OpenTelemetry
is imported and nothing is spent: this module decides before ``spans`` (which imports the SDK) is
loaded.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from ...commandline import install_extra

if TYPE_CHECKING:
    from websockets.datastructures import Headers

    from .spans import ExecutionSpans

log = logging.getLogger(__name__)

ASKING: Final = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# What the runner makes whatever these say: a warning tells an operator who asked for another.
MADE: Final = {
    "OTEL_TRACES_EXPORTER": "otlp",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
}


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ASKING)


def from_environment(environ: Mapping[str, str] = os.environ) -> ExecutionSpans | None:
    """The daemon's tracer when the environment asks for traces and the SDK is installed, else None
    (with a warning when traces were asked for but cannot be made, or not as asked)."""
    if not wanted(environ):
        return None
    for name, supported in MADE.items():
        asked = [value.strip() for value in environ.get(name, "").lower().split(",") if value.strip()]
        if [value for value in asked if value != supported]:
            log.warning(
                "%s=%s is not supported: the runner sends its traces over OTLP/HTTP (%s=%s)",
                name,
                environ[name],
                name,
                supported,
                extra={"setting": name},
            )
    try:
        from .spans import ExecutionSpans  # noqa: PLC0415 - the optional extra, loaded only when asked for
    except ImportError as exc:
        log.warning("OTEL_* asks for traces, but OpenTelemetry is not installed (%s): %s", exc, install_extra("otel"))
        return None
    return ExecutionSpans()


def trace_context(headers: Headers) -> dict[str, str]:
    """The host's W3C trace context from its handshake: its one ``traceparent`` and, with it, its
    ``tracestate`` (several headers are one list, joined by commas), which the runner's spans carry
    on. The SDK's propagator judges both and ignores what is not well formed."""
    traceparents = headers.get_all("traceparent")
    if len(traceparents) != 1:
        return {}
    context = {"traceparent": traceparents[0]}
    if tracestates := headers.get_all("tracestate"):
        context["tracestate"] = ",".join(tracestates)
    return context
