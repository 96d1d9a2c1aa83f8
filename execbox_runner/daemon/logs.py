"""The daemon's logs: JSON lines (or plain text), one line per execution at least.

Execution lines carry the id, outcome, error code, duration, tool-call count
and peer, and the codes of failing tool results that were outside the stable
set (the guest saw them as ``tool_error``). Guest code is never logged unless the operator asks for it
(``--log-guest-code``); tool inputs and results are never logged.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Final

from ..protocol.session import ExecutionEnded

EXECUTIONS: Final = logging.getLogger("execbox_runner.executions")
_STANDARD_FIELDS: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object: time, level, logger, message, and any extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update({key: value for key, value in vars(record).items() if key not in _STANDARD_FIELDS})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(level: str, json_lines: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("websockets").setLevel(logging.WARNING)


def execution_ended(record: ExecutionEnded, peer: str, code: str | None) -> None:
    """The execution line; ``code`` is the guest code, only when the operator logs it."""
    fields: dict[str, object] = {
        "execution_id": record.id,
        "outcome": record.outcome,
        "error_code": record.code,
        "duration_ms": round(record.duration_s * 1000, 3),
        "tool_calls": record.tool_calls,
        "peer": peer,
    }
    if record.unknown_tool_codes:
        fields["unknown_tool_error_codes"] = list(record.unknown_tool_codes)
    if code is not None:
        fields["guest_code"] = code
    EXECUTIONS.info("execution %s", record.outcome, extra=fields)
