"""The code-mode MCP server: ``search_tools`` and ``execute_code`` over wrapped MCP servers.

An MCP client sees two tools instead of every wrapped server's dozens; guest
code runs on an execbox runner (a private local one, or a remote one), never
in this process.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping
from functools import partial
from typing import Annotated, Literal

import mcp_types
import uvicorn
from mcp.server import MCPServer
from mcp.server.elicitation import AcceptedElicitation
from mcp.server.mcpserver import Context
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from pydantic import Field

from .. import __version__
from ..client import ApprovalRequest, Runner
from ..commandline import cannot_listen
from .access import Access, Guard, default_hosts
from .approval import Approval, question, verdict
from .codemode import DEFAULT_BOUNDS, Bounds, CodeMode
from .config import UpstreamServer
from .provider import mcp_tools
from .rounds import Rounds, asks_in_rounds
from .upstream import connect_upstreams

APPROVAL_INPUT_CHARS = 500  # of a call's input, shown to the user who approves it
CALL_GRACE_S = 1.0  # an upstream call outlives its execution's timeout by at most this before it is abandoned


def code_mode_server(code_mode: CodeMode, name: str = "execbox-code-mode", rounds: Rounds | None = None) -> MCPServer:
    """An ``MCPServer`` whose two tools are ``code_mode``'s. ``rounds`` asks clients of the stateless
    protocol for approvals (without it, their calls of tools that need approval are refused)."""
    namespaces = ", ".join(code_mode.namespaces) or "none"
    server: MCPServer = MCPServer(
        name, version=__version__, instructions=f"Code mode over MCP servers; namespaces: {namespaces}."
    )

    async def execute_code(
        code: Annotated[str, Field(description="JavaScript; the value of the last expression is the result")],
        context: Context,
    ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
        if rounds is not None and asks_in_rounds(context):
            return await rounds.execute_code(code, context)
        return await code_mode.execute_code(code, context.report_progress, partial(ask_the_user, context))

    def search_tools(
        query: Annotated[
            str, Field(description="words to look for in tool names and descriptions; empty or left out for all")
        ] = "",
        limit: Annotated[int, Field(description="how many tools at most", ge=1, le=200)] = 10,
    ) -> str:
        return code_mode.search_tools(query, limit)

    server.add_tool(
        search_tools,
        description=(
            "Find tools of the wrapped MCP servers by words and return their TypeScript declarations; "
            f"namespaces: {namespaces}."
        ),
        structured_output=False,
    )
    server.add_tool(
        execute_code,
        description=(
            "Run JavaScript in a sandbox where each wrapped MCP server is a global namespace of async functions "
            "(`await ns.tool({...})`; find them with search_tools). Top-level await works; the last expression is "
            "the result. Returns JSON {ok, result, error: {code, message}, logs}."
        ),
    )
    return server


async def ask_the_user(context: Context, request: ApprovalRequest) -> bool | str:
    """Ask the MCP client's user, through elicitation, whether the program may make ``request``'s call."""
    try:
        answer = await context.elicit(question(request, APPROVAL_INPUT_CHARS), Approval)
    except MCPError as exc:  # a client that cannot elicit
        return f"the user could not be asked ({exc.message})"
    if isinstance(answer, AcceptedElicitation):
        return True if answer.data.approve else "the user refused"
    return verdict(answer.action, None)


async def serve(
    servers: Mapping[str, UpstreamServer],
    runner: Runner,
    bounds: Bounds = DEFAULT_BOUNDS,
    *,
    transport: Literal["stdio", "http"] = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    startup_timeout: float = 30.0,
    access: Access | None = None,
    parse_json_text: bool = True,
) -> None:
    """Connect to ``servers``, start ``runner`` (enter it here) and serve code mode until stopped.
    Over HTTP, ``access`` says who may use it (by default: loopback Host names, no browser
    Origin, no token; see ``access``). ``parse_json_text``: a wrapped tool's text result that is
    one JSON object or array reaches the guest parsed (``provider.result_json``).

    The runner is stopped first on the way out: a wrapped server that hangs on its way out (the SDK
    gives it seconds) must not keep a private runner alive past an MCP client's kill.
    """
    async with connect_upstreams(servers, startup_timeout=startup_timeout) as sessions, runner:
        call_timeout = bounds.timeout_ms / 1000 + CALL_GRACE_S
        namespaces = {
            name: await mcp_tools(
                session, call_timeout=call_timeout, parse_json_text=parse_json_text, approve=servers[name].approve
            )
            for name, session in sessions.items()
        }
        code_mode = CodeMode(runner, namespaces, bounds)
        async with Rounds.running(code_mode, APPROVAL_INPUT_CHARS) as rounds:
            server = code_mode_server(code_mode, rounds=rounds)
            if transport == "stdio":
                await server.run_stdio_async()
            else:
                await serve_http(server, host, port, access or Access(default_hosts(host)))


class CannotServe(Exception):
    """The HTTP address cannot be listened on; the message says why and what to do."""


async def serve_http(server: MCPServer, host: str, port: int, access: Access) -> None:
    """Streamable HTTP on ``host``:``port`` (``/mcp``), behind ``access``, which replaces the SDK's
    own Host and Origin checks (those are on only for a loopback ``host``, and it has no tokens).

    The sockets listen from here, not from uvicorn, which on failure logs the reason and exits: a
    taken port is ``CannotServe`` with the reason and the way out, for the command's one line.
    The address served is said on stderr (the port ``--port 0`` picked)."""
    checks_off = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    app = Guard(server.streamable_http_app(host=host, transport_security=checks_off), access)
    config = uvicorn.Config(app, host=host, port=port, log_level=server.settings.log_level.lower())
    try:
        listeners = listening_sockets(host, port)
    except OSError as exc:
        raise CannotServe(cannot_listen(f"{host}:{port}", exc)) from None
    bound = listeners[0].getsockname()[1]
    print(f"execbox-runner mcp: serving MCP clients on http://{_url_host(host)}:{bound}/mcp", file=sys.stderr)
    await uvicorn.Server(config).serve(sockets=listeners)


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """A TCP socket listening on each address of ``host`` on ``port``, as asyncio's ``create_server``
    makes them (IPv6 ones IPv6 only), so connections wait from now on until uvicorn serves them;
    ``OSError`` (all closed) for an address that cannot be had."""
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen()
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
