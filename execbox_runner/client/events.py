"""What an execution shows while it runs, for hosts that display it (a UI, a shell): each log line
as the guest writes it, each tool call as the guest makes it, then the end.

Lines stream live from a runner that offers the ``live-logs`` extension; from any other runner they
all arrive with the ``done``. Either way each line of the result's ``logs`` is shown once, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from .execution import ExecuteResult  # which imports this module


@dataclass(frozen=True)
class LogEvent:
    """A line the guest logged (``console.log`` and its siblings), as the runner truncated it."""

    line: str


@dataclass(frozen=True)
class ToolCallEvent:
    """The guest called ``provider.tool`` with ``input`` (``None`` for ``undefined``); the host answers it."""

    provider: str
    tool: str
    input: Any


@dataclass(frozen=True)
class DoneEvent:
    """The execution ended; its result, as ``Runner.execute`` returns it."""

    result: ExecuteResult


Event: TypeAlias = LogEvent | ToolCallEvent | DoneEvent
"""What iterating ``Runner.events`` gives: each ``LogEvent`` and ``ToolCallEvent``, then one ``DoneEvent``."""
Observer: TypeAlias = Callable[[LogEvent | ToolCallEvent], object]  # awaited if it returns an awaitable
