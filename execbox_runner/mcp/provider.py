"""An MCP server's tools as one provider namespace of the host SDK.

Each MCP tool becomes a client ``Tool`` with the server's own JSON Schemas, so
the client checks the guest's input before any call reaches the server and
renders the schemas into the ``types`` a model reads. Results come back as
JSON: the structured content when the server gave one, else the text, parsed when it is one JSON
object or array (most servers return JSON that way), unless ``parse_json_text`` is off; a result
with images or resources is its list of MCP content blocks.

A call's progress notifications go to ``upstream_progress``, which code mode sets for the length
of one ``execute_code``, so an MCP client sees a wrapped tool's progress as that call's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection
from contextvars import ContextVar
from functools import partial
from typing import Any

import mcp_types
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from ..client import ApprovalRequest, Tool, ToolError

#: Where a wrapped tool's progress messages go while an execution runs (None: nowhere).
upstream_progress: ContextVar[Callable[[str], Awaitable[None]] | None] = ContextVar("upstream_progress", default=None)
#: Who approves the calls of tools that need it while an execution runs: the MCP client's user (None: no one).
user_approval: ContextVar[Callable[[ApprovalRequest], Awaitable[bool | str]] | None] = ContextVar(
    "user_approval", default=None
)


async def list_mcp_tools(session: ClientSession) -> list[mcp_types.Tool]:
    """Every tool of a connected session, following the server's pagination."""
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        page = await session.list_tools(params=mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


async def mcp_tools(
    session: ClientSession,
    *,
    call_timeout: float | None = None,
    parse_json_text: bool = True,
    approve: Collection[str] | bool = False,
) -> dict[str, Tool]:
    """``{"tool name": Tool}`` for one namespace of a ``Providers`` mapping.

    ``Providers({"github": await mcp_tools(session)})`` gives the guest
    ``await github.search_issues({...})``; names are sanitized to ``safeName``s
    there, as for any tool. ``call_timeout`` (seconds) bounds each call;
    ``None`` leaves the session's own read timeout. ``parse_json_text``: see ``result_json``.
    ``approve``: the tools (MCP names; ``True``: all) whose calls ``user_approval`` must approve.
    """
    tools = await list_mcp_tools(session)
    return {
        tool.name: as_tool(
            session,
            tool,
            call_timeout,
            parse_json_text,
            approve is True or (approve is not False and tool.name in approve),
        )
        for tool in tools
    }


def as_tool(
    session: ClientSession,
    tool: mcp_types.Tool,
    call_timeout: float | None = None,
    parse_json_text: bool = True,
    needs_approval: bool = False,
) -> Tool:
    """One MCP tool as a client ``Tool`` that calls it over ``session``."""

    async def call(arguments: Any) -> Any:
        report = upstream_progress.get()
        progress = None if report is None else partial(_progress, report, tool.name)
        try:
            result = await session.call_tool(
                tool.name, arguments if arguments is not None else {}, call_timeout, progress_callback=progress
            )
        except MCPError as exc:  # a JSON-RPC error: unknown tool, invalid params, a timeout, a lost connection
            if exc.code == CONNECTION_CLOSED:  # for good: say so, or a model retries "Connection closed"
                gone = "its MCP server closed the connection (it exited or went away); restart code mode to reconnect"
                raise ToolError("tool_error", f"Tool {tool.name} is unavailable: {gone}") from None
            raise ToolError("tool_error", exc.message) from None
        return result_json(tool.name, result, parse_json_text=parse_json_text)

    return Tool(
        call,
        description=_described(tool, parse_json_text),
        input_schema=_null_when_optional(tool.input_schema),
        output_schema=tool.output_schema,
        approve=_ask_the_user if needs_approval else None,
    )


async def _ask_the_user(request: ApprovalRequest) -> bool | str:
    """The approval of a call that needs it, from the MCP client's user; refused with no one to ask."""
    ask = user_approval.get()
    if ask is None:
        return "it needs the user's approval, and no MCP client is there to ask"
    return await ask(request)


def _described(tool: mcp_types.Tool, parse_json_text: bool) -> str | None:
    """The tool's description, saying what a result without an output schema is (the declaration's
    return type is then ``unknown``)."""
    description = tool.description or tool.title
    if tool.output_schema is not None:
        return description
    text = "its text, parsed when it is one JSON object or array" if parse_json_text else "its text, a string"
    returns = f"{text}; a result with images or resources is its MCP content blocks, [{{type, ...}}]"
    return f"{description}\n\nReturns {returns}." if description else f"Returns {returns}."


def _null_when_optional(schema: dict[str, Any]) -> dict[str, Any]:
    """Let the guest leave out an input with no required properties (``await files.list()``), as MCP
    clients may: the client checks a missing input as ``null``, and the call then sends ``{}``."""
    if schema.get("type") == "object" and not schema.get("required"):
        return {**schema, "type": ["object", "null"]}
    return schema


async def _progress(
    report: Callable[[str], Awaitable[None]], name: str, progress: float, total: float | None, message: str | None
) -> None:
    """A wrapped tool's progress notification, as one line: its message, else how far it is."""
    done = f"{progress:g}" if total is None else f"{progress:g}/{total:g}"
    await report(f"{name}: {message or done}")


def result_json(name: str, result: mcp_types.CallToolResult, *, parse_json_text: bool = True) -> Any:
    """The JSON value of a tool result: its structured content, else its text, parsed when it is
    exactly one JSON object or array and ``parse_json_text`` is on (other text stays a string:
    ``"42"`` from a server is as likely words as a number), else, when it has other content
    (images, audio, resources), its content blocks as MCP's JSON (``[{"type": "image", "data",
    "mimeType"}, ...]``): text alone would lose them. ``is_error`` raises ``tool_error`` with the
    server's message."""
    text = "\n".join(block.text for block in result.content if isinstance(block, mcp_types.TextContent))
    if result.is_error:
        raise ToolError("tool_error", text or f"Tool {name} failed")
    if result.structured_content is not None:
        return result.structured_content
    if not all(isinstance(block, mcp_types.TextContent) for block in result.content):
        return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]
    if parse_json_text and text.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(text, parse_constant=_not_json)
        except ValueError:
            pass
    return text


def _not_json(constant: str) -> None:
    """``NaN`` and ``Infinity``, which Python's parser takes and JSON has not: the text stays text."""
    raise ValueError(f"{constant} is not JSON")
