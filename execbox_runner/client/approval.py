"""Approval of tool calls made from guest code: a tool can require the host's yes before it runs.

A model's program can call a destructive tool (delete, pay, send) as easily as a harmless one. A
tool given an ``approve`` callback (``Tool(func, approve=...)``, or ``Providers(..., approve=...)``
for every tool without its own) runs only once the callback says yes: it gets an
``ApprovalRequest`` (which tool, with which input, already checked against the tool's schema) and
returns ``True`` to approve, or ``False`` or a reason (a string) to refuse. It may be async, or a
plain function (run in a thread, so it may block, say on a prompt). Meanwhile the guest's call waits,
within the execution's timeout: an execution that times out while the host is asking ends as
``timeout``, and the question is cancelled. A refusal rejects the guest's promise with
``tool_error`` and a message the guest can catch, and the tool does not run.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import anyio.to_thread

from .errors import ToolError


@dataclass(frozen=True)
class ApprovalRequest:
    """A tool call awaiting the host's approval: ``provider.tool`` and its input (decoded JSON)."""

    provider: str
    tool: str
    input: Any


Approver: TypeAlias = Callable[[ApprovalRequest], "bool | str | Awaitable[bool | str]"]


async def require_approval(approve: Approver, request: ApprovalRequest) -> None:
    """Ask ``approve``; raise ``ToolError("tool_error", ...)`` unless it answers ``True``."""
    if inspect.iscoroutinefunction(approve):
        verdict = await approve(request)
    else:
        verdict = await anyio.to_thread.run_sync(approve, request, abandon_on_cancel=True)
        if inspect.isawaitable(verdict):
            verdict = await verdict
    if verdict is True:
        return
    reason = f": {verdict}" if isinstance(verdict, str) and verdict else ""
    raise ToolError("tool_error", f"Tool {request.provider}.{request.tool} was not approved{reason}")
