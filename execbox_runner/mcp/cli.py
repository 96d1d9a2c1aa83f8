"""``execbox-runner mcp``: serve code mode over the MCP servers of a config file.

This module only parses arguments, so the command line works (and ``--help``
prints) without the ``mcp`` extra; the SDK is imported when the command runs.

Exit status, as every command's: 0 stopped (the MCP client closed stdio, or
SIGINT/SIGTERM); 1 it failed: a wrapped server or the runner could not be
started or reached, or the HTTP port cannot be bound; 2 a usage or
configuration error: a bad flag or value (a ``--url`` that is not ``ws://`` or
``wss://``, a token that cannot be sent), a config file that is missing or
invalid, the ``mcp`` extra not installed, HTTP on a non-loopback address without
tokens (see ``access``). A runner that fails one execution (unreachable,
refusing it) is that ``execute_code`` call's error, not an exit, with its reason.
"""

from __future__ import annotations

import argparse
import signal
import sys
from functools import partial

import anyio

from ..client import Runner, RunnerError
from ..client.environment import TOKEN_ENV, URL_ENV, from_environment
from ..client.runner import DEFAULT_LIMITS
from ..commandline import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    HelpFormatter,
    count,
    exit_statuses,
    install_extra,
    milliseconds,
    port,
    seconds,
)
from .access import TOKEN_ENV as HTTP_TOKEN_ENV
from .access import http_access
from .config import load_servers

PROG = "execbox-runner mcp"


def add_mcp_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "mcp",
        help="serve an MCP server with search_tools and execute_code over the MCP servers of a config file",
        description="Serve code mode to MCP clients: two tools, search_tools and execute_code, over the tools of the"
        " MCP servers in --config. Guest code runs on a runner (a private local one by default), never here.",
        formatter_class=HelpFormatter,
        epilog=exit_statuses(
            failure="a wrapped server or the runner could not be started or reached, or the port cannot be bound",
            usage="a bad flag or value, a missing or invalid --config, the mcp extra not installed, HTTP off"
            " loopback without a token (--http-token-file, --http-token) or --allow-unauthenticated",
            ok="stopped (stdio closed, SIGINT or SIGTERM)",
        )
        + """

examples:
  execbox-runner mcp --config servers.json                       over stdio, for an MCP client to start
  execbox-runner mcp --config servers.json --transport http --port 8000
  (servers.json: {"mcpServers": {"files": {"command": "npx", "args": ["-y", "server-files", "."]}}})""",
    )
    parser.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help='the wrapped servers, {"mcpServers": {"name": {"command": ...} or {"url": ...}}}',
    )
    runner = parser.add_argument_group("Runner")
    runner.add_argument(
        "--url",
        help=f"a running runner, ws://HOST:PORT/ or wss://... (default: ${URL_ENV}, else a private local runner)",
    )
    runner.add_argument("--token", help=f"bearer token for --url (default: ${TOKEN_ENV})")
    serving = parser.add_argument_group("Serving MCP clients")
    serving.add_argument(
        "--transport", choices=("stdio", "http"), default="stdio", help="how MCP clients connect (default: %(default)s)"
    )
    serving.add_argument("--host", default="127.0.0.1", help="address for --transport http (default: %(default)s)")
    serving.add_argument(
        "--port",
        type=port,
        default=8000,
        help="port for --transport http, whose endpoint is /mcp (its URL is said on stderr); 0 picks a free port"
        " (default: %(default)s)",
    )
    serving.add_argument(
        "--http-token",
        default="",
        metavar="TOKENS",
        help=f"bearer tokens, comma-separated, one of which MCP clients must send over HTTP (default:"
        f" ${HTTP_TOKEN_ENV}); prefer the variable or --http-token-file",
    )
    serving.add_argument(
        "--http-token-file", default="", metavar="FILE", help="a file of such tokens, one per line (# comments)"
    )
    serving.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve a non-loopback --host over HTTP without tokens (refused otherwise)",
    )
    serving.add_argument(
        "--allowed-hosts",
        default="",
        metavar="HOSTS",
        help="comma-separated Host header values MCP clients may use, NAME:PORT, or NAME:* for any port"
        " (default: 127.0.0.1, localhost, [::1] and --host, any port); any other gets HTTP 403",
    )
    serving.add_argument(
        "--allowed-origins",
        default="",
        metavar="ORIGINS",
        help="comma-separated Origin values allowed, SCHEME://NAME:PORT or SCHEME://NAME:* (default: none);"
        " a request with any other gets HTTP 403 (browsers send one, other MCP clients do not)",
    )
    serving.add_argument(
        "--startup-timeout",
        type=seconds,
        default=30.0,
        metavar="SECONDS",
        help="seconds each wrapped server has to start and list its tools (default: %(default)g)",
    )
    serving.add_argument(
        "--keep-json-text",
        dest="parse_json_text",
        action="store_false",
        help="give the guest a wrapped tool's text result as a string even when it is one JSON object or array"
        " (by default such text is parsed)",
    )
    limits = parser.add_argument_group("Limits of each execute_code call")
    limits.add_argument(
        "--timeout-ms", type=milliseconds, default=10_000, metavar="MS", help="time budget (default: %(default)g)"
    )
    limits.add_argument(
        "--memory-limit-bytes",
        type=count,
        default=DEFAULT_LIMITS["memory_limit_bytes"],
        metavar="BYTES",
        help="guest heap (default: %(default)s)",
    )
    limits.add_argument(
        "--max-tool-calls", type=count, default=100, metavar="N", help="tool calls allowed (default: %(default)s)"
    )
    limits.add_argument(
        "--max-result-chars",
        type=count,
        default=20_000,
        metavar="N",
        help="longest result (and logs) returned to the MCP client (default: %(default)s)",
    )


def run_mcp(args: argparse.Namespace) -> int:
    try:
        servers = load_servers(args.config)
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:  # imported here: the `mcp` SDK is an optional extra, needed by this command only
        from .codemode import Bounds  # noqa: PLC0415
        from .server import CannotServe, serve  # noqa: PLC0415
    except ImportError as exc:
        print(f"{PROG}: {exc}; {install_extra('mcp')}", file=sys.stderr)
        return EXIT_USAGE
    access = None
    if args.transport == "http":
        try:
            access = http_access(
                args.host,
                tokens=args.http_token,
                token_file=args.http_token_file,
                hosts=args.allowed_hosts,
                origins=args.allowed_origins,
                allow_unauthenticated=args.allow_unauthenticated,
            )
        except ValueError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    bounds = Bounds(args.timeout_ms, args.memory_limit_bytes, args.max_tool_calls, args.max_result_chars)
    url = args.url or from_environment(URL_ENV, PROG)
    token = args.token or from_environment(TOKEN_ENV, PROG)
    try:
        runner = Runner.connect(url, token=token) if url else Runner.local()
    except ValueError as exc:  # a URL that is not ws:// or wss://, a token that cannot be sent
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    main = partial(
        serve,
        servers,
        runner,
        bounds,
        transport=args.transport,
        host=args.host,
        port=args.port,
        startup_timeout=args.startup_timeout,
        access=access,
        parse_json_text=args.parse_json_text,
    )
    # SIGTERM unwinds like Ctrl-C, so leaving `serve` stops the local runner and the stdio servers
    # (uvicorn hands the signal back once it has shut down).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    failure: Exception | str | None = None
    try:
        anyio.run(main)
    except* KeyboardInterrupt:
        pass
    except* (ConnectionError, RunnerError, CannotServe) as group:  # task groups (ours, the SDK's) may wrap them
        failure = group.exceptions[0]
        while isinstance(failure, ExceptionGroup):
            failure = failure.exceptions[0]
    except* SystemExit:  # uvicorn's, when it cannot start (it has logged why): not its status 3
        failure = f"cannot serve MCP clients on http://{args.host}:{args.port}/mcp"
    if failure is not None:
        print(f"{PROG}: {failure}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK
