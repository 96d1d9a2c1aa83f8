"""Code mode over wrapped MCP servers: find tools by query, run one program that calls many.

A model calls ``search_tools`` to read the TypeScript declarations of the tools
it needs, then ``execute_code`` once with JavaScript that awaits them as
``namespace.tool(input)``; only the program's result (and logs) come back.
Every execution is bounded: time and memory by the runner, the number of tool
calls and the size of what is returned here.

While it runs, ``report`` (an MCP request's progress) gets a message for each line the guest logs,
each tool it calls and each progress notification of a wrapped tool, so an MCP client can show the
program at work.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

import mcp_types

from ..client import (
    ApprovalRequest,
    DoneEvent,
    ExecuteResult,
    LogEvent,
    Providers,
    Runner,
    RunnerError,
    ToolCallEvent,
)
from ..client.tools import ProviderTools
from ..client.typescript import declare_namespace
from .config import guest_namespaces
from .failures import described
from .provider import upstream_progress, user_approval

log = logging.getLogger(__name__)

#: An MCP request's progress: (how far, of how much, message), as ``Context.report_progress`` takes it.
Report: TypeAlias = Callable[[float, float | None, str | None], Awaitable[None]]
#: Asks the user to approve a tool call: ``True``, or why not.
Ask: TypeAlias = Callable[[ApprovalRequest], Awaitable[bool | str]]


@dataclass(frozen=True)
class Bounds:
    """The limits of one ``execute_code`` call."""

    timeout_ms: float = 10_000
    memory_limit_bytes: int = 64 * 1024 * 1024
    max_tool_calls: int = 100
    max_result_chars: int = 20_000
    max_log_lines: int = 100

    def __post_init__(self) -> None:
        """Refuse a bound that would fail every execution, at start-up rather than at the first call."""
        if min(self.timeout_ms, self.memory_limit_bytes, self.max_tool_calls, self.max_result_chars) <= 0:
            raise ValueError(f"every bound must be above 0: {self}")


DEFAULT_BOUNDS: Final = Bounds()


@dataclass(frozen=True)
class _Entry:
    """One tool as search finds it: its guest name and declaration."""

    namespace: str
    safe: str
    declaration: str
    text: str  # what a query is matched against, lower-cased


class CodeMode:
    """``search_tools`` and ``execute_code`` over provider namespaces, run on ``runner``.

    ``namespaces`` maps a server name (sanitized into a guest global) to its
    tools, for example ``{"github": await mcp_tools(session)}``; any tools of a
    ``Providers`` mapping may sit beside them (Python functions, ``Tool``s). Two names that are one
    namespace in the guest (``a-b``, ``a_b``) raise ``ValueError``.
    """

    def __init__(self, runner: Runner, namespaces: ProviderTools, bounds: Bounds = DEFAULT_BOUNDS):
        self._runner = runner
        self._bounds = bounds
        guests = guest_namespaces(namespaces)
        self._providers = Providers({guests[name]: tools for name, tools in namespaces.items()})
        self._catalog = [
            _Entry(
                namespace,
                tool.safeName,
                declaration,
                f"{namespace}.{tool.safeName} {tool.originalName or ''} {tool.description or ''}".lower(),
            )
            for namespace, tool, declaration in self._providers.declarations()
        ]

    @property
    def namespaces(self) -> list[str]:
        return [manifest.name for manifest in self._providers.manifests]

    def search_tools(self, query: str = "", limit: int = 10) -> str:
        """TypeScript declarations of the tools that best match ``query`` (every word counts; empty: all)."""
        words = query.lower().split()
        scored = [(sum(word in entry.text for word in words), index) for index, entry in enumerate(self._catalog)]
        ranked = sorted((item for item in scored if item[0] or not words), key=lambda item: (-item[0], item[1]))
        found = [self._catalog[index] for _, index in ranked[: max(limit, 1)]]
        by_namespace: dict[str, list[str]] = {}
        for entry in found:
            by_namespace.setdefault(entry.namespace, []).append(entry.declaration)
        header = (
            f"// {len(found)} of {len(self._catalog)} tools; call them in execute_code as `await namespace.tool(input)`"
        )
        body = "\n\n".join(declare_namespace(name, members) for name, members in by_namespace.items())
        return _truncate(f"{header}\n{body}", self._bounds.max_result_chars)

    async def execute_code(
        self, code: str, report: Report | None = None, ask: Ask | None = None
    ) -> mcp_types.CallToolResult:
        """Run ``code`` against the tools; the result's JSON holds ``ok``, ``result``, ``error`` and ``logs``.
        ``report`` gets the program's progress as it runs (see the module docstring); ``ask`` approves
        the calls of tools that need it (else they are refused)."""
        steps = 0

        async def say(message: str) -> None:
            nonlocal steps
            steps += 1
            if report is not None:
                await report(steps, None, message)

        reset = upstream_progress.set(say if report is not None else None)
        reset_ask = user_approval.set(ask)
        try:
            result = await self._run(code, say)
        except RunnerError as exc:
            body = _failed("runner_unavailable", str(exc))
        except Exception as exc:  # anything else too reaches the MCP client with its reason
            log.debug("execute_code failed", exc_info=True)
            body = _failed("internal_error", described(exc))
        else:
            error = None if result.error is None else {"code": result.error.code, "message": result.error.message}
            body = {"ok": result.ok, "result": result.result, "error": error, "logs": result.logs}
        finally:
            upstream_progress.reset(reset)
            user_approval.reset(reset_ask)
        text = json.dumps(body, ensure_ascii=False)
        shown = _truncate(text, self._bounds.max_result_chars)
        content: list[mcp_types.ContentBlock] = [mcp_types.TextContent(type="text", text=shown)]
        return mcp_types.CallToolResult(
            content=content, structured_content=body if shown == text else None, is_error=not body["ok"]
        )

    async def _run(self, code: str, say: Callable[[str], Awaitable[None]]) -> ExecuteResult:
        """One execution within the bounds, each log line and tool call told to ``say`` as it happens."""
        bounds = self._bounds
        async with self._runner.events(
            code,
            self._providers.limited(bounds.max_tool_calls),
            timeout_ms=bounds.timeout_ms,
            memory_limit_bytes=bounds.memory_limit_bytes,
            max_log_lines=bounds.max_log_lines,
            max_log_chars=bounds.max_result_chars,
        ) as events:
            async for event in events:
                if isinstance(event, LogEvent):
                    await say(event.line)
                elif isinstance(event, ToolCallEvent):
                    await say(f"calling {event.provider}.{event.tool}")
                elif isinstance(event, DoneEvent):
                    return event.result
        raise AssertionError("the events of an execution end with its DoneEvent")  # pragma: no cover


def _failed(code: str, message: str) -> dict[str, Any]:
    """The answer of an execution that did not run to its end, in the shape of every other."""
    return {"ok": False, "result": None, "error": {"code": code, "message": message}, "logs": []}


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n... [truncated: {len(text) - limit} of {len(text)} characters left out]"
