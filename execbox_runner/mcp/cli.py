"""``execbox-runner mcp``: serve code mode over the MCP servers of a config file.

This module only parses arguments, so the command line works (and ``--help``
prints) without the ``mcp`` extra; the SDK is imported when the command runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from functools import partial

import anyio

from ..client import Runner, RunnerError
from ..client.cli import TOKEN_ENV
from ..client.runner import DEFAULT_LIMITS
from .config import load_servers

EXIT_FAILURE = 1
EXIT_USAGE = 2


def add_mcp_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "mcp", help="serve an MCP server with search_tools and execute_code over the MCP servers of a config file"
    )
    parser.add_argument(
        "--config",
        required=True,
        help='the wrapped servers, {"mcpServers": {"name": {"command": ...} or {"url": ...}}}',
    )
    parser.add_argument("--url", help="a running runner, ws://HOST:PORT/ or wss://... (default: start a local one)")
    parser.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV), help=f"bearer token for --url (default: ${TOKEN_ENV})"
    )
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="how MCP clients connect")
    parser.add_argument("--host", default="127.0.0.1", help="address for --transport http")
    parser.add_argument("--port", type=int, default=8000, help="port for --transport http (the endpoint is /mcp)")
    parser.add_argument("--timeout-ms", type=float, default=10_000, help="each execution's time budget")
    parser.add_argument(
        "--memory-limit-bytes", type=int, default=DEFAULT_LIMITS["memory_limit_bytes"], help="each execution's heap"
    )
    parser.add_argument("--max-tool-calls", type=int, default=100, help="tool calls allowed per execution")
    parser.add_argument(
        "--max-result-chars", type=int, default=20_000, help="longest result (and logs) returned to the MCP client"
    )
    parser.add_argument(
        "--startup-timeout", type=float, default=30.0, help="seconds each wrapped server has to start and list tools"
    )


def run_mcp(args: argparse.Namespace) -> int:
    try:
        servers = load_servers(args.config)
    except ValueError as exc:
        print(f"execbox-runner mcp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:  # imported here: the `mcp` SDK is an optional extra, needed by this command only
        from .codemode import Bounds  # noqa: PLC0415
        from .server import serve  # noqa: PLC0415
    except ImportError as exc:
        print(f"execbox-runner mcp: {exc}; install it with: pip install 'execbox-runner[mcp]'", file=sys.stderr)
        return EXIT_USAGE
    try:
        bounds = Bounds(args.timeout_ms, args.memory_limit_bytes, args.max_tool_calls, args.max_result_chars)
    except ValueError as exc:
        print(f"execbox-runner mcp: {exc}", file=sys.stderr)
        return EXIT_USAGE
    runner = Runner.connect(args.url, token=args.token) if args.url else Runner.local()
    main = partial(
        serve,
        servers,
        runner,
        bounds,
        transport=args.transport,
        host=args.host,
        port=args.port,
        startup_timeout=args.startup_timeout,
    )
    # SIGTERM unwinds like Ctrl-C, so leaving `serve` stops the local runner and the stdio servers
    # (uvicorn hands the signal back once it has shut down).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    failure: Exception | None = None
    try:
        anyio.run(main)
    except* KeyboardInterrupt:
        pass
    except* (ConnectionError, RunnerError) as group:  # task groups of the SDK may wrap them
        failure = group.exceptions[0]
    if failure is not None:
        print(f"execbox-runner mcp: {failure}", file=sys.stderr)
        return EXIT_FAILURE
    return 0
