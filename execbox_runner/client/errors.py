"""What can go wrong outside the guest, as exceptions a host can catch by kind.

Whatever the guest does (throws, times out, runs out of memory) comes back as
an ``ExecuteResult`` with an error code. These exceptions are for the
infrastructure instead: a runner that cannot be reached, refuses the
handshake, or goes away before its ``done``. ``ToolError`` is the other way
round: a tool raises it to fail with a stable code of its choosing.
"""

from __future__ import annotations

import json

from ..protocol.messages import ERROR_CODES, ErrorCode


class ToolError(Exception):
    """Raised by a tool to fail with one of the stable error codes.

    Any other exception from a tool becomes ``tool_error`` with the
    exception's message; this one keeps ``code``, so guest code (and the
    final result, when uncaught) sees, for example, ``validation_error``.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}; use one of {sorted(ERROR_CODES)}")
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message


class RunnerError(Exception):
    """The runner could not run the execution; nothing is known about its outcome."""


class RunnerUnavailable(RunnerError):
    """No WebSocket connection: the address is unreachable, the handshake timed out or was not WebSocket."""


class RunnerRefused(RunnerError):
    """The runner answered the handshake with an HTTP error instead of a session."""

    def __init__(self, url: str, status: int, body: str, retry_after: float | None) -> None:
        reason = _field(body, "message") or body.strip()  # the runner's reason, not its JSON
        detail = f": {reason}" if reason else ""
        super().__init__(f"{url} refused the WebSocket handshake with HTTP {status}{detail}")
        self.status = status
        self.body = body
        self.retry_after = retry_after


class Unauthorized(RunnerRefused):
    """HTTP 401: the token is missing or not one the runner accepts."""


class RunnerBusy(RunnerRefused):
    """HTTP 503: the runner is at its session limit or draining; try again after ``retry_after`` seconds."""


class QuotaExceeded(RunnerRefused):
    """HTTP 429: this token's tenant is at one of its quotas (``quota``: ``max_sessions``,
    ``executions_per_minute``, ``memory_in_flight_bytes``); try again after ``retry_after`` seconds."""

    def __init__(self, url: str, status: int, body: str, retry_after: float | None) -> None:
        super().__init__(url, status, body, retry_after)
        self.quota = _field(body, "quota")


class RunnerDisconnected(RunnerError):
    """The connection ended before the execution's ``done`` (the runner stopped, crashed or closed it)."""

    def __init__(self, message: str, code: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class RunnerProtocolError(RunnerError):
    """The runner sent something that is not a runner message; the connection was closed."""


def _field(body: str, name: str) -> str | None:
    """A string field of a runner's JSON answer to a refused handshake, if it has one."""
    try:
        value = json.loads(body).get(name)
    except (ValueError, AttributeError):
        return None
    return value.strip() or None if isinstance(value, str) else None
