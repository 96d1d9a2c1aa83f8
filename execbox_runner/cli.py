"""``execbox-runner``: one command line, each command's code with its part of the package.

``serve`` and ``info`` are the daemon's (``daemon/cli.py``); ``exec`` and ``replay`` the Python
client's (``client/cli.py``, ``client/replay.py``); ``mcp`` code mode's (``mcp/cli.py``). This
module builds the parser from theirs and dispatches; what the commands share (exit statuses, the
help's layout, numeric options) is ``commandline``.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from typing import NoReturn

from . import __version__
from .client.cli import add_exec_parser, run_exec
from .client.replay import add_replay_parser, run_replay
from .commandline import EXIT_FAILURE, EXIT_USAGE, HelpFormatter, exit_statuses
from .daemon.cli import add_daemon_parsers, run_daemon_command
from .mcp.cli import add_mcp_parser, run_mcp


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (the full usage of ``serve`` is dozens)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
        prog="execbox-runner",
        description="An execbox runner: runs untrusted guest JavaScript in sandboxed QuickJS workers for remote"
        " hosts over WebSocket, with the clients to use one from a shell.",
        formatter_class=HelpFormatter,
        epilog=exit_statuses(
            failure="the run failed: a guest error, a runner that could not be reached or went away, a port"
            " that cannot be bound, a replayed session that differed",
            usage="a bad flag, value or setting, a missing file, a runner that refused the request as invalid"
            " (HTTP 401/403, limits above its maxima)",
        )
        + """

examples:
  execbox-runner serve --tokens-file tokens.txt    serve ws://127.0.0.1:8765/
  execbox-runner info                              what this host can enforce
  execbox-runner exec '6 * 7'                      run code on a private local runner
  execbox-runner COMMAND --help                    a command's options""",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_daemon_parsers(commands)
    add_replay_parser(commands)
    add_exec_parser(commands)
    add_mcp_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the command they were given to, as its other usage errors are
        _command_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        status = _run(args, argv)
        sys.stdout.flush()  # what is still buffered: a full disk or a closed pipe shows here
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ENOSPC):
            raise
        # stdout's reader left (`info | head`): stop quietly, as other tools do; a full one is said
        if exc.errno == errno.ENOSPC:
            print(f"execbox-runner: cannot write to stdout: {exc.strerror}", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return EXIT_FAILURE
    return status


def _command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of ``command``, one of ``parser``'s commands."""
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    chosen: argparse.ArgumentParser = commands.choices[command]
    return chosen


def _run(args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.command == "exec":
        return run_exec(args)
    if args.command == "mcp":
        return run_mcp(args)
    if args.command == "replay":
        return run_replay(args)
    return run_daemon_command(args, argv)
