"""An MCP server's tools as one provider namespace of the host SDK.

Each MCP tool becomes a client ``Tool`` with the server's own JSON Schemas, so
the client checks the guest's input before any call reaches the server and
renders the schemas into the ``types`` a model reads. Results come back as
JSON: the structured content when the server gave one, else the text.
"""

from __future__ import annotations

from typing import Any

import mcp_types
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from ..client import Tool, ToolError


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


async def mcp_tools(session: ClientSession, *, call_timeout: float | None = None) -> dict[str, Tool]:
    """``{"tool name": Tool}`` for one namespace of a ``Providers`` mapping.

    ``Providers({"github": await mcp_tools(session)})`` gives the guest
    ``await github.search_issues({...})``; names are sanitized to ``safeName``s
    there, as for any tool. ``call_timeout`` (seconds) bounds each call;
    ``None`` leaves the session's own read timeout.
    """
    return {tool.name: as_tool(session, tool, call_timeout) for tool in await list_mcp_tools(session)}


def as_tool(session: ClientSession, tool: mcp_types.Tool, call_timeout: float | None = None) -> Tool:
    """One MCP tool as a client ``Tool`` that calls it over ``session``."""

    async def call(arguments: Any) -> Any:
        try:
            result = await session.call_tool(tool.name, arguments if arguments is not None else {}, call_timeout)
        except MCPError as exc:  # a JSON-RPC error: unknown tool, invalid params, a timeout, a lost connection
            raise ToolError("tool_error", exc.message) from None
        return result_json(tool.name, result)

    return Tool(
        call,
        description=tool.description or tool.title,
        input_schema=_null_when_optional(tool.input_schema),
        output_schema=tool.output_schema,
    )


def _null_when_optional(schema: dict[str, Any]) -> dict[str, Any]:
    """Let the guest leave out an input with no required properties (``await files.list()``), as MCP
    clients may: the client checks a missing input as ``null``, and the call then sends ``{}``."""
    if schema.get("type") == "object" and not schema.get("required"):
        return {**schema, "type": ["object", "null"]}
    return schema


def result_json(name: str, result: mcp_types.CallToolResult) -> Any:
    """The JSON value of a tool result; ``is_error`` raises ``tool_error`` with the server's message."""
    text = "\n".join(block.text for block in result.content if isinstance(block, mcp_types.TextContent))
    if result.is_error:
        raise ToolError("tool_error", text or f"Tool {name} failed")
    if result.structured_content is not None:
        return result.structured_content
    return text
