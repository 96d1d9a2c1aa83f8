"""The Python host SDK: run guest JavaScript on an execbox runner against your own Python functions.

    async with Runner.local() as runner:  # or Runner.connect("ws://...", token=...)
        result = await runner.execute("await math.add({a: 1, b: 2})", providers={"math": {"add": add}})

The client talks to a daemon over the wire only; it never imports the daemon
or the worker.
"""

from ..protocol.messages import ErrorInfo
from .approval import ApprovalRequest
from .errors import (
    QuotaExceeded,
    RunnerBusy,
    RunnerDisconnected,
    RunnerError,
    RunnerProtocolError,
    RunnerRefused,
    RunnerUnavailable,
    ToolError,
    Unauthorized,
)
from .events import DoneEvent, Event, LogEvent, ToolCallEvent
from .execution import ExecuteResult
from .runner import EventStream, Limits, Runner
from .tools import Providers, ProviderTools, Tool, safe_name

__all__ = [
    "ApprovalRequest",
    "DoneEvent",
    "ErrorInfo",
    "Event",
    "EventStream",
    "ExecuteResult",
    "Limits",
    "LogEvent",
    "ProviderTools",
    "Providers",
    "QuotaExceeded",
    "Runner",
    "RunnerBusy",
    "RunnerDisconnected",
    "RunnerError",
    "RunnerProtocolError",
    "RunnerRefused",
    "RunnerUnavailable",
    "Tool",
    "ToolCallEvent",
    "ToolError",
    "Unauthorized",
    "safe_name",
]
