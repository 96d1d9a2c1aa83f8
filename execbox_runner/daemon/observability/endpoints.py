"""The plain-HTTP side of the daemon: health, readiness, metrics, admission.

Every request on the sessions' port reaches the daemon as a WebSocket handshake
request. ``route`` answers the ones that are not sessions (``GET /healthz``,
``GET /readyz``, ``GET /metrics``) and refuses handshakes that may not
become sessions: a missing, wrong or repeated bearer token (401, tokens compared in
constant time), an Origin not listed in ``--allowed-origins`` or repeated (403: hosts send
none, browsers always one, and a WebSocket is not bound by CORS, so without this any web page
the user visits could run code on a runner on loopback), or a daemon that cannot take a
session now (draining, or at its maximum of concurrent sessions: 503 with
``Retry-After``). All of this happens before any session exists: a host is
never accepted and then starved. Everything else becomes a session.

What the daemon tells about itself (``/metrics``, and ``/healthz`` with its
sessions, memory and protections) need not be public: with ``--metrics-port``
it is served there (``observe``) and no longer on the sessions' port, and with
a metrics token only to a request that bears one. The probes never need
anything: ``/readyz`` and a bare ``/healthz`` (``{"status": "alive"}``) answer
on both ports, so kubelet and load balancer checks keep working.

Every refusal is counted (``/metrics``) and logged with its peer, but a flood
must not fill the disk: ``Refusals`` writes a few lines a second per reason
and sums up the rest in one line a second.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from . import logs
from .metrics import CONTENT_TYPE, Metrics

if TYPE_CHECKING:
    from .spans import ExecutionSpans  # imports OpenTelemetry: only where traces are on

log = logging.getLogger(__name__)

RETRY_AFTER_S: Final = 1
# New sessions are refused once the process tree holds this share of the memory budget.
ADMIT_MEMORY_SHARE: Final = 0.9
# Why a handshake was refused (the ``reason`` label of execbox_rejected_handshakes_total), as logged.
REFUSALS: Final = {
    "unauthorized": "no valid bearer token",
    "origin": "Origin not allowed",
    "draining": "draining",
    "busy": "at the maximum of concurrent sessions",
    "memory": "near the memory budget",
    "quota": "the tenant is at one of its quotas",
    "shed": "closed unanswered to make room for newer connections",
}
# Refusal lines per reason: this many a second on average, at most this many at once.
REFUSAL_LINES_PER_S: Final = 5.0
REFUSAL_LINES_BURST: Final = 10
# How often the refusals left unlogged are summed up (by the server).
REFUSAL_SUMMARY_S: Final = 1.0


class TokenBucket:
    """At most ``rate`` events a second on average and ``burst`` at once: a bucket of
    ``burst`` tokens refilled continuously, one token an event."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        """Whether an event may happen now (and spend its token)."""
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class Refusals:
    """Refused handshakes: every one counted (for ``/metrics``), each logged with its peer,
    a few lines a second per reason; ``summarize`` (called once a second) adds one line
    for each reason whose lines were suppressed, so a flood costs a bounded log."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.counts = dict.fromkeys(REFUSALS, 0)
        self._lines = {reason: TokenBucket(REFUSAL_LINES_PER_S, REFUSAL_LINES_BURST, clock) for reason in REFUSALS}
        self._suppressed = dict.fromkeys(REFUSALS, 0)
        # Executes refused at a quota on sessions already open: logged at the same rate, apart.
        self._executions = TokenBucket(REFUSAL_LINES_PER_S, REFUSAL_LINES_BURST, clock)
        self._executions_suppressed = 0

    def refuse(self, reason: str, peer: str, **fields: str) -> None:
        """Count a refusal and log it (if under its rate); ``fields`` (a quota refusal's ``tenant``
        and ``quota``) go into the line, so an operator sees whom a refusal hit."""
        self.counts[reason] += 1
        if self._lines[reason].take():
            said = (": " if fields else "") + ", ".join(f"{name} {value}" for name, value in fields.items())
            log.info(
                "refused a handshake from %s: %s (%s%s)",
                peer or "an unknown peer",
                reason,
                REFUSALS[reason],
                said,
                extra={"refusal": reason, "peer": peer, **fields},
            )
        else:
            self._suppressed[reason] += 1

    def refuse_execution(self, execution_id: str, peer: str, correlation_id: str, tenant: str, quota: str) -> None:
        """Log an execute refused on an open session, its tenant at ``quota`` (if under the rate)."""
        if not self._executions.take():
            self._executions_suppressed += 1
            return
        execution_id = logs.clipped(execution_id)
        log.info(
            "refused execution %s on a session from %s: tenant %s is at its %s quota",
            execution_id,
            peer or "an unknown peer",
            tenant,
            quota,
            extra={"execution_id": execution_id, "correlation_id": correlation_id, "tenant": tenant, "quota": quota},
        )

    def summarize(self) -> None:
        """One line per reason for the refusals not logged since the last summary."""
        if self._executions_suppressed:
            log.warning(
                "suppressed %d refused executions (quota): more than %g lines a second",
                self._executions_suppressed,
                REFUSAL_LINES_PER_S,
                extra={"refusal": "execution_quota", "suppressed": self._executions_suppressed},
            )
            self._executions_suppressed = 0
        for reason, count in self._suppressed.items():
            if count:
                log.warning(
                    "suppressed %d refusals (%s): more than %g lines a second",
                    count,
                    reason,
                    REFUSAL_LINES_PER_S,
                    extra={"refusal": reason, "suppressed": count},
                )
                self._suppressed[reason] = 0


@dataclass
class DaemonState:
    """What the endpoints report, kept current by the server."""

    max_sessions: int
    report: Mapping[str, object]  # the host report (``daemon.report.HostReport``)
    tokens: tuple[bytes, ...] = ()  # accepted bearer tokens; empty: no authentication
    tenant_names: tuple[str, ...] = ()  # the tenant of each token (``tenants``)
    metrics_tokens: tuple[bytes, ...] = ()  # bearer tokens /metrics and the detailed /healthz need; empty: none
    separate_metrics: bool = False  # /metrics and the detailed /healthz are on the metrics port only
    allowed_origins: frozenset[str] = frozenset()  # empty: no Origin (only hosts that send none)
    share_workers: bool = False  # executions of different tokens may share worker processes
    metrics: Metrics | None = None
    traces: ExecutionSpans | None = None  # with the otel extra and OTEL_* asking for traces
    sessions: int = 0
    draining: bool = False
    pool_ready: bool = False
    refusals: Refusals = field(default_factory=Refusals)
    memory_budget: int = 1 << 62  # bytes the daemon, its zygote and its workers may hold
    memory_used: int = 0  # their resident memory, sampled by the server

    @property
    def ready(self) -> bool:
        return self.pool_ready and not self.draining


def _json(status: int, reason: str, body: dict[str, object], extra: list[tuple[str, str]] | None = None) -> Response:
    data = json.dumps(body).encode()
    headers = Headers(
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(data))),
            ("Cache-Control", "no-store"),
            *(extra or []),
        ]
    )
    return Response(status, reason, headers, data)


def _authorized(header: str, tokens: tuple[bytes, ...]) -> bool:
    """Whether ``header`` carries one of ``tokens``; compares with every token, in constant time."""
    scheme = header.partition(" ")[0]
    presented = _presented(header)
    matched = False
    for token in tokens:
        matched |= hmac.compare_digest(presented, token)
    return scheme.lower() == "bearer" and matched


def _presented(header: str) -> bytes:
    return header.partition(" ")[2].strip().encode()


def _bears(request: Request, tokens: tuple[bytes, ...]) -> bool:
    """Exactly one Authorization header, with one of ``tokens``. Repeated headers are ambiguous
    credentials: whichever one a proxy or a reader picks, they are refused rather than judged by one."""
    authorizations = request.headers.get_all("Authorization")
    return len(authorizations) == 1 and _authorized(authorizations[0], tokens)


def _unauthorized(message: str) -> Response:
    return _json(
        401,
        "Unauthorized",
        {"error": "unauthorized", "message": message},
        [("WWW-Authenticate", 'Bearer realm="execbox-runner"')],
    )


def over_quota(tenant: str, quota: str, retry_after_s: float, message: str, state: DaemonState, peer: str) -> Response:
    """A tenant's handshake refused at one of its quotas (``tenants``): 429, with ``Retry-After``."""
    state.refusals.refuse("quota", peer, tenant=tenant, quota=quota)
    body: dict[str, object] = {"error": "quota", "quota": quota, "tenant": tenant, "message": message}
    return _json(429, "Too Many Requests", body, [("Retry-After", str(max(1, math.ceil(retry_after_s))))])


def _not_found(message: str) -> Response:
    return _json(404, "Not Found", {"error": "not_found", "message": message})


def tenant(request: Request, state: DaemonState) -> str:
    """The tenant whose token the request bears (``tenants``), "" without tokens."""
    if not state.tokens:  # every handshake asks: without tokens, not even the header is looked up
        return ""
    presented = _presented(request.headers.get("Authorization", ""))
    for token, name in zip(state.tokens, state.tenant_names, strict=True):
        if hmac.compare_digest(presented, token):
            return name
    return ""


def bad_request(message: str) -> Response:
    return _json(400, "Bad Request", {"error": "bad_request", "message": message})


def _observation(path: str, request: Request, state: DaemonState, *, details: bool) -> Response | None:
    """``/readyz``, ``/healthz`` and ``/metrics``; None for any other path. A ``HEAD`` request (a
    load balancer's check) gets the answer's status and headers without its body, as HTTP asks."""
    answer = _answer(path, request, state, details=details)
    if answer is not None and request.method == "HEAD":
        return replace(answer, body=b"")
    return answer


def _answer(path: str, request: Request, state: DaemonState, *, details: bool) -> Response | None:
    """``/readyz``, ``/healthz`` and ``/metrics``; None for any other path. ``details`` (the
    detailed ``/healthz``, ``/metrics``) are served where they live, to a bearer of a metrics
    token when there are any; elsewhere ``/healthz`` is the bare answer probes need."""
    if path == "/readyz":
        if state.ready:
            return _json(200, "OK", {"status": "ready"})
        return _json(
            503,
            "Service Unavailable",
            {"status": "draining" if state.draining else "starting"},
            [("Retry-After", str(RETRY_AFTER_S))],
        )
    shown = details and (not state.metrics_tokens or _bears(request, state.metrics_tokens))
    if path == "/healthz":
        if not shown:
            return _json(200, "OK", {"status": "alive"})
        return _json(
            200,
            "OK",
            {
                "status": "alive",
                "sessions": state.sessions,
                "draining": state.draining,
                "memory": {"used_bytes": state.memory_used, "budget_bytes": state.memory_budget},
                "protections": state.report.get("protections"),
                "network_mechanism": state.report.get("network_mechanism"),
                "unsafe_settings": state.report.get("unsafe_settings"),
            },
        )
    if path == "/metrics" and state.metrics is not None:
        if not details:
            return _not_found("/metrics is served on the metrics port")
        if not shown:
            return _unauthorized("exactly one Authorization header with a valid metrics bearer token is required")
        body = state.metrics.render()
        return Response(
            200,
            "OK",
            Headers(
                [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]
            ),
            body,
        )
    return None


def observe(request: Request, state: DaemonState) -> Response:
    """The metrics port's answer: the probes and the details, and no sessions."""
    path = request.path.split("?", 1)[0]
    return _observation(path, request, state, details=True) or _not_found(f"no {path} here")


def route(request: Request, state: DaemonState, *, peer: str = "") -> Response | None:
    """The response to a non-session request or a refused handshake; None to accept a session.

    ``peer`` (``host:port``) is what a refusal's log line names."""
    path = request.path.split("?", 1)[0]
    answer = _observation(path, request, state, details=not state.separate_metrics)
    if answer is not None:
        return answer
    if state.tokens and not _bears(request, state.tokens):
        state.refusals.refuse("unauthorized", peer)
        return _unauthorized("exactly one Authorization header with a valid bearer token is required")
    origins = request.headers.get_all("Origin")
    if origins and (len(origins) > 1 or origins[0] not in state.allowed_origins):
        state.refusals.refuse("origin", peer)
        return _json(403, "Forbidden", {"error": "origin", "message": f"origin {', '.join(origins)!r} is not allowed"})
    if state.draining:
        refusal, message = "draining", "the runner is shutting down"
    elif state.sessions >= state.max_sessions:
        refusal, message = "busy", f"the runner is at its maximum of {state.max_sessions} concurrent sessions"
    elif state.memory_used >= state.memory_budget * ADMIT_MEMORY_SHARE:
        refusal, message = "memory", "the runner is near its memory budget"
    else:
        return None
    state.refusals.refuse(refusal, peer)
    return _json(
        503, "Service Unavailable", {"error": refusal, "message": message}, [("Retry-After", str(RETRY_AFTER_S))]
    )
