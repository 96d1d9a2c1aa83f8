"""Connections to the wrapped MCP servers, open for as long as the code-mode server runs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

import httpx2
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client import Transport
from mcp.client.streamable_http import streamable_http_client

from .config import UpstreamServer


@asynccontextmanager
async def connect_upstreams(
    servers: Mapping[str, UpstreamServer], *, startup_timeout: float = 30.0
) -> AsyncIterator[dict[str, ClientSession]]:
    """A connected session per server, closed (stdio servers stopped) on leaving.

    ``startup_timeout`` bounds each handshake and tool listing, so a server
    that never answers fails the start instead of hanging it.
    """
    async with AsyncExitStack() as stack:
        sessions: dict[str, ClientSession] = {}
        for name, server in servers.items():
            client = Client(await _transport(server, stack), read_timeout_seconds=startup_timeout)
            try:
                await stack.enter_async_context(client)
            except Exception as exc:
                raise ConnectionError(f"MCP server {name!r} did not start: {exc}") from exc
            sessions[name] = client.session
        yield sessions


async def _transport(server: UpstreamServer, stack: AsyncExitStack) -> StdioServerParameters | str | Transport:
    if server.command is not None:
        return StdioServerParameters(command=server.command, args=server.args, env=server.env, cwd=server.cwd)
    assert server.url is not None
    if not server.headers:
        return server.url
    http = await stack.enter_async_context(httpx2.AsyncClient(headers=server.headers, follow_redirects=False))
    return streamable_http_client(server.url, http_client=http)
