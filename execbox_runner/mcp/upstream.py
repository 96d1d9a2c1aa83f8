"""Connections to the wrapped MCP servers, open for as long as the code-mode server runs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import httpx2
from anyio.abc import TaskStatus
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client import Transport
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED

from .config import UpstreamServer
from .failures import described, innermost

log = logging.getLogger(__name__)


@asynccontextmanager
async def connect_upstreams(
    servers: Mapping[str, UpstreamServer], *, startup_timeout: float = 30.0
) -> AsyncIterator[dict[str, ClientSession]]:
    """A connected session per server, closed (stdio servers stopped) on leaving.

    ``startup_timeout`` bounds each server's start and handshake as a whole, and each request of
    its tool listing, so a server that never answers fails the start instead of hanging it. A
    server that does not start raises ``ConnectionError`` saying why (it exited, it timed out).
    """
    async with AsyncExitStack() as stack, anyio.create_task_group() as holders:
        sessions: dict[str, ClientSession] = {}
        for name, server in servers.items():
            client = Client(await _transport(server, stack), read_timeout_seconds=startup_timeout)
            try:
                with anyio.fail_after(startup_timeout):
                    sessions[name] = await holders.start(_hold, name, client)
            except TimeoutError:
                raise ConnectionError(
                    f"MCP server {name!r} did not start: it did not complete the MCP handshake within"
                    f" {startup_timeout:g} s (--startup-timeout)"
                ) from None
            except Exception as exc:
                raise ConnectionError(f"MCP server {name!r} did not start: {_why(server, exc)}") from exc
        yield sessions
        holders.cancel_scope.cancel()


async def _hold(name: str, client: Client, *, task_status: TaskStatus[ClientSession]) -> None:
    """Connect ``client`` and keep it open until cancelled: its task, not the caller's, holds the SDK's
    task groups, so the caller can give up on a handshake that takes too long.

    A connection that fails once connected (the server went away) is logged, not raised: it
    would end the task group, and with it every other server and code mode itself. Its tools'
    calls then fail, each with its own ``tool_error``."""
    connected = False
    try:
        async with client:
            task_status.started(client.session)
            connected = True
            await anyio.sleep_forever()
    except Exception as exc:
        if not connected:
            raise
        log.warning("MCP server %r is gone: %s", name, described(exc))


def _why(server: UpstreamServer, exc: BaseException) -> str:
    """Why a server did not start, in words."""
    inner = innermost(exc)
    if isinstance(inner, MCPError) and inner.code == CONNECTION_CLOSED and server.command is not None:
        return f"{server.command!r} exited, or closed its stdout, before the MCP handshake (see its stderr)"
    return described(inner)


async def _transport(server: UpstreamServer, stack: AsyncExitStack) -> StdioServerParameters | str | Transport:
    if server.command is not None:
        return StdioServerParameters(command=server.command, args=server.args, env=server.env, cwd=server.cwd)
    assert server.url is not None
    if not server.headers:
        return server.url
    http = await stack.enter_async_context(httpx2.AsyncClient(headers=server.headers, follow_redirects=False))
    return streamable_http_client(server.url, http_client=http)
