"""``execbox-runner exec``: run JavaScript from a shell, on a private local runner or a remote one.

The guest's logs go to stderr and its result, as JSON, to stdout, so the
output can be piped; the exit status is 0 only when the execution succeeded
(1 for a guest error, 2 when no runner could run it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .errors import RunnerError
from .runner import DEFAULT_LIMITS, Runner

TOKEN_ENV = "EXECBOX_TOKEN"  # noqa: S105 -- the name of the variable, not a token


def add_exec_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "exec", help="run JavaScript on a runner (a private local one by default); print its logs and result"
    )
    parser.add_argument("code", metavar="CODE_OR_FILE", help="guest code, a file holding it, or - for stdin")
    parser.add_argument("--url", help="a running runner, ws://HOST:PORT/ or wss://... (default: start a local one)")
    parser.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV), help=f"bearer token for --url (default: ${TOKEN_ENV})"
    )
    parser.add_argument(
        "--timeout-ms", type=float, default=DEFAULT_LIMITS["timeout_ms"], help="the execution's time budget"
    )


def run_exec(args: argparse.Namespace) -> int:
    code = sys.stdin.read() if args.code == "-" else _code(args.code)
    runner = Runner.connect(args.url, token=args.token) if args.url else Runner.local()
    try:
        with runner:
            result = runner.execute_sync(code, timeout_ms=args.timeout_ms)
    except (RunnerError, ValueError) as exc:
        print(f"execbox-runner exec: {exc}", file=sys.stderr)
        return 2
    for line in result.logs:
        print(line, file=sys.stderr)
    if result.error is not None:
        print(f"error: {result.error.code}: {result.error.message}", file=sys.stderr)
        return 1
    print(json.dumps(result.result, ensure_ascii=False))  # an undefined result prints as null
    return 0


def _code(argument: str) -> str:
    """The file's text when the argument names a file, else the argument itself."""
    try:
        return Path(argument).read_text() if Path(argument).is_file() else argument
    except (OSError, ValueError):  # not a possible path (too long, NUL bytes): code
        return argument
