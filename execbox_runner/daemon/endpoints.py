"""The plain-HTTP side of the daemon's one port: health, readiness, admission.

Every request reaches the daemon as a WebSocket handshake request. ``route``
answers the ones that are not sessions (``GET /healthz``, ``GET /readyz``,
``GET /metrics``; unauthenticated so that probes and scrapers work) and refuses handshakes that may not
become sessions: a missing, wrong or repeated bearer token (401, tokens compared in
constant time), an Origin not allowed or repeated (403), or a daemon that cannot take a
session now (draining, or at its maximum of concurrent sessions: 503 with
``Retry-After``). All of this happens before any session exists: a host is
never accepted and then starved. Everything else becomes a session.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass, field
from typing import Final

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from .metrics import CONTENT_TYPE, Metrics

RETRY_AFTER_S: Final = 1
# New sessions are refused once the process tree holds this share of the memory budget.
ADMIT_MEMORY_SHARE: Final = 0.9


@dataclass
class DaemonState:
    """What the endpoints report, kept current by the server."""

    max_sessions: int
    report: dict[str, object]
    tokens: tuple[bytes, ...] = ()  # accepted bearer tokens; empty: no authentication
    allowed_origins: frozenset[str] = frozenset()  # empty: any Origin
    share_workers: bool = False  # executions of different tokens may share worker processes
    metrics: Metrics | None = None
    sessions: int = 0
    draining: bool = False
    pool_ready: bool = False
    refused: dict[str, int] = field(
        default_factory=lambda: {"unauthorized": 0, "origin": 0, "draining": 0, "busy": 0, "memory": 0, "shed": 0}
    )
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


def tenant(request: Request, state: DaemonState) -> str:
    """Whose workers an accepted session's executions run in: one set per token, unless shared."""
    if state.share_workers or not state.tokens:
        return ""
    presented = _presented(request.headers.get("Authorization", ""))
    for index, token in enumerate(state.tokens):
        if hmac.compare_digest(presented, token):
            return f"token-{index}"
    return ""


def bad_request(message: str) -> Response:
    return _json(400, "Bad Request", {"error": "bad_request", "message": message})


def route(request: Request, state: DaemonState) -> Response | None:
    """The response to a non-session request or a refused handshake; None to accept a session."""
    path = request.path.split("?", 1)[0]
    if path == "/healthz":
        return _json(
            200,
            "OK",
            {
                "status": "alive",
                "sessions": state.sessions,
                "draining": state.draining,
                "memory": {"used_bytes": state.memory_used, "budget_bytes": state.memory_budget},
                "protections": state.report.get("protections"),
                "unsafe_settings": state.report.get("unsafe_settings"),
            },
        )
    if path == "/metrics" and state.metrics is not None:
        body = state.metrics.render()
        return Response(
            200,
            "OK",
            Headers(
                [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(body))), ("Cache-Control", "no-store")]
            ),
            body,
        )
    if path == "/readyz":
        if state.ready:
            return _json(200, "OK", {"status": "ready"})
        return _json(
            503,
            "Service Unavailable",
            {"status": "draining" if state.draining else "starting"},
            [("Retry-After", str(RETRY_AFTER_S))],
        )
    # Repeated headers are ambiguous credentials: whichever one a proxy or a reader picks, the
    # handshake is refused rather than judged by one of them.
    authorizations = request.headers.get_all("Authorization")
    if state.tokens and not (len(authorizations) == 1 and _authorized(authorizations[0], state.tokens)):
        state.refused["unauthorized"] += 1
        return _json(
            401,
            "Unauthorized",
            {
                "error": "unauthorized",
                "message": "exactly one Authorization header with a valid bearer token is required",
            },
            [("WWW-Authenticate", 'Bearer realm="execbox-runner"')],
        )
    origins = request.headers.get_all("Origin")
    if state.allowed_origins and (len(origins) > 1 or not state.allowed_origins.issuperset(origins)):
        state.refused["origin"] += 1
        return _json(403, "Forbidden", {"error": "origin", "message": f"origin {', '.join(origins)!r} is not allowed"})
    if state.draining:
        refusal, message = "draining", "the runner is shutting down"
    elif state.sessions >= state.max_sessions:
        refusal, message = "busy", f"the runner is at its maximum of {state.max_sessions} concurrent sessions"
    elif state.memory_used >= state.memory_budget * ADMIT_MEMORY_SHARE:
        refusal, message = "memory", "the runner is near its memory budget"
    else:
        return None
    state.refused[refusal] += 1
    return _json(
        503, "Service Unavailable", {"error": refusal, "message": message}, [("Retry-After", str(RETRY_AFTER_S))]
    )
