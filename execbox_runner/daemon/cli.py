"""``execbox-runner``: the command line of the daemon, and of the clients beside it.

``serve`` runs the daemon, ``info`` reports what this host enforces with the
same settings, ``replay`` plays recorded sessions against a runner; ``exec``
and ``mcp`` are the clients' (``client/cli.py``, ``mcp/cli.py``).

Exit statuses, one scheme for every command (``client.cli.exit_statuses``): 0 ok (for
``serve``, a clean stop after a complete drain); 1 the run failed: a port that
cannot be bound, a stop forced by a second signal, a replayed session that
differed, a runner that could not be reached or went away; 2 a usage or
configuration error, reported in one line before anything starts: a bad flag,
value or setting, a missing file, a runner that refused the request as invalid
(HTTP 401 or 403).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import ssl
import sys
from typing import Final, NoReturn

import anyio
import trio
from execbox_runner_conformance.report import summary
from execbox_runner_conformance.runner import Target, TargetError, run_all
from execbox_runner_conformance.transcript import Transcript, TranscriptError, load_transcript

from .. import __version__
from ..client.cli import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    HelpFormatter,
    add_exec_parser,
    exit_status,
    exit_statuses,
    run_exec,
    seconds,
)
from ..client.environment import TOKEN_ENV, URL_ENV, from_environment
from ..client.errors import RunnerError
from ..client.transport import WebSocket
from ..mcp.cli import add_mcp_parser, run_mcp
from . import config, supervisor
from .machine import BUDGET_SHARE, default_processes, usable_cores
from .net.listeners import CannotListen
from .observability import logs
from .report import UNSAFE_SETTINGS, HostReport, host_report
from .server import ConfigurationError, Daemon, size, url
from .startup import listening_line

log = logging.getLogger("execbox_runner")
REPLAY_TIMEOUT_S: Final = 5.0


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (the full usage of ``serve`` is dozens)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


SETTINGS_DESCRIPTION: Final = (
    "Every setting below is a flag, an environment variable EXECBOX_RUNNER_<SETTING> and a key of the --config file;"
    " a flag wins over the variable, which wins over the file."
)


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
    serve_parser = commands.add_parser(
        "serve",
        help="serve ws://HOST:PORT/ until SIGINT or SIGTERM",
        description="Serve execbox hosts on ws://HOST:PORT/ (wss:// with --certfile) until SIGINT or SIGTERM, then"
        " drain. " + SETTINGS_DESCRIPTION,
        usage="%(prog)s [--config FILE] [--SETTING VALUE ...]",
        formatter_class=HelpFormatter,
        epilog=exit_statuses(
            failure="a port that cannot be bound, or a stop forced by a second signal during the drain",
            usage="an invalid setting (one line, before anything starts)",
            ok="a clean stop: every execution finished or was cancelled within the drain",
        )
        + """

examples:
  execbox-runner serve --port 0                               a free port, printed on stdout
  EXECBOX_RUNNER_TOKENS_FILE=tokens.txt execbox-runner serve --host 0.0.0.0 --certfile cert.pem --keyfile key.pem
  execbox-runner serve --config runner.toml --log-format text""",
    )
    config.add_arguments(serve_parser)
    info_parser = commands.add_parser(
        "info",
        help="report what this host enforces with these settings",
        description="Report what the daemon would enforce on this host with these settings: the engine, limits,"
        " protections and unsafe settings. Takes the same settings as serve. " + SETTINGS_DESCRIPTION,
        usage="%(prog)s [--json] [--config FILE] [--SETTING VALUE ...]",
        formatter_class=HelpFormatter,
        epilog=exit_statuses(failure=None, usage="an invalid setting", ok="the report was printed")
        + "\n\nexamples:\n  execbox-runner info --profile hardened\n  execbox-runner info --json",
    )
    info_parser.add_argument("--json", action="store_true", help="the report as JSON")
    config.add_arguments(info_parser)
    replay_parser = commands.add_parser(
        "replay",
        help="play recorded sessions' host side against a runner and report differences",
        description="Play the host side of recorded sessions (the *.jsonl of serve --record-dir) against a runner"
        " and report where its answers differ: one PASS or FAIL line per file, then the totals.",
        formatter_class=HelpFormatter,
        epilog=exit_statuses(
            failure="a session differed, or the runner could not be reached or went away",
            usage="a bad flag, a missing or malformed file, a runner that refused the handshake (HTTP 401/403)",
            ok="every session replayed as recorded",
        )
        + "\n\nexample:\n  execbox-runner replay --url ws://127.0.0.1:8765/ records/*.jsonl",
    )
    replay_parser.add_argument("files", nargs="+", metavar="FILE", help="recorded sessions (*.jsonl from --record-dir)")
    replay_parser.add_argument("--url", help=f"the runner to replay against, ws://HOST:PORT/ (default: ${URL_ENV})")
    replay_parser.add_argument("--token", help=f"bearer token for --url (default: ${TOKEN_ENV})")
    replay_parser.add_argument(
        "--timeout",
        type=seconds,
        default=REPLAY_TIMEOUT_S,
        metavar="SECONDS",
        help="seconds to wait for each expected runner message (default: %(default)g)",
    )
    add_exec_parser(commands)
    add_mcp_parser(commands)
    return parser


def _replay(args: argparse.Namespace) -> int:
    """Replay with the conformance kit: one PASS/FAIL line per file, then the totals."""
    prog = "execbox-runner replay"
    url = args.url or from_environment(URL_ENV, prog)
    token = args.token or from_environment(TOKEN_ENV, prog)
    if not url:
        print(f"{prog}: error: give the runner's URL: --url or ${URL_ENV}", file=sys.stderr)
        return EXIT_USAGE
    try:
        transcripts: list[Transcript] = [load_transcript(path) for path in args.files]
        anyio.run(_handshake, url, token)
    except (TranscriptError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RunnerError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exit_status(exc)
    headers = (("Authorization", f"Bearer {token}"),) if token else ()
    try:
        results = run_all(Target(url, headers), transcripts, timeout=args.timeout, progress=lambda r: print(r.line()))
    except TargetError as exc:  # gone since the handshake above
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(summary(results))
    return EXIT_OK if all(result.passed for result in results) else EXIT_FAILURE


async def _handshake(url: str, token: str | None) -> None:
    """Open and close one session, so that a runner that refuses the URL or the token is told from
    one that answers differently (a usage error, not a difference)."""
    websocket = await WebSocket.open(url, token=token)
    await websocket.close()


def _info(settings: config.Settings, as_json: bool) -> int:
    report = host_report(settings)
    if as_json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    print(f"execbox-runner {report['version']} on Python {report['python']} ({report['machine']})")
    print(f"engine: {report['engine']}")
    quickjs = report["quickjs"]
    freeing = "runtimes discarded whole" if quickjs["discards_runtimes"] else "runtimes freed object by object"
    budget = "memory budgets checked in C" if quickjs["budget_in_c"] else "memory budgets checked in Python hooks"
    accessors = "accessors made on first use" if quickjs["lazy_accessors"] else "accessors made with each runtime"
    lazy_clock = quickjs["lazy_clock"]
    clock = "time limit's clock read at its first check" if lazy_clock else "time limit's clock read per call"
    compiled = "compiled profile-guided" if quickjs["profile_guided"] else "compiled without a profile"
    arenas = f"{quickjs['arena_bytes'] // 1024} KiB arenas"
    print(f"  {arenas}, {freeing}, {budget}, {accessors}, {clock}, {compiled}")
    print(f"profile: {report['profile']}")
    for line in _limit_lines(settings, report):
        print(line)
    print(
        f"interrupting running guests: {'yes' if report['interrupt_running_guests'] else 'no (unresponsive workers are killed)'}"
    )
    print("protections:")
    for name, state in report["protections"].items():
        status = "enforced" if state["enforced"] else ("NOT ENFORCEABLE" if state["requested"] else "off")
        print(f"  {name:<22} {status}")
    print(f"network namespace made by: {report['network_mechanism']}")
    for warning in report["warnings"]:
        print(f"warning: {warning}")
    for name in report["unsafe_settings"]:
        print(f"UNSAFE {name}: {UNSAFE_SETTINGS[name]}")
    return EXIT_OK


def _limit_lines(settings: config.Settings, report: HostReport) -> list[str]:
    """The limits in force, one per line, with where a machine-sized one came from."""
    limits, timeouts = report["limits"], report["timeouts_s"]
    budget, memory = report["memory_budget_bytes"], report["memory_bytes"]
    processes = settings.processes or default_processes(usable_cores())
    sized = {
        "max_sessions": "" if settings.max_sessions else " (sized from memory and descriptors)",
        "processes": "" if settings.processes else " (one per two usable cores)",
        "memory_budget": "" if settings.memory_budget_bytes else f" ({BUDGET_SHARE:.0%} of {size(memory)})",
    }
    rows = [
        ("max sessions", f"{limits['max_sessions']}{sized['max_sessions']}"),
        ("daemon processes", f"{processes}{sized['processes']}"),
        ("max workers", f"{limits['max_workers']} ({limits['warm_workers']} started ahead)"),
        ("worker capacity", f"{limits['worker_capacity']} executions at once per worker"),
        ("max timeoutMs", f"{limits['max_timeout_ms']} ({limits['max_timeout_ms'] / 1000:g} s)"),
        ("max memoryLimitBytes", f"{limits['max_memory_limit_bytes']} ({size(limits['max_memory_limit_bytes'])})"),
        ("memory budget", f"{size(budget)}{sized['memory_budget']}"),
        ("max message", size(limits["max_message_bytes"])),
        ("max output", size(limits["max_output_bytes"])),
        ("timeouts", ", ".join(f"{name.replace('_', ' ')} {value:g} s" for name, value in timeouts.items())),
    ]
    return ["limits:", *(f"  {name:<22} {value}" for name, value in rows)]


async def _serve_until_signalled(daemon: Daemon) -> int:
    """Serve until SIGINT or SIGTERM, then drain; a second signal during the drain stops at once.

    The drain runs beside the signal loop, so the second signal is seen while it waits.
    Returns the exit status: 0 after a complete drain, 1 when stopped at once.
    """
    status = EXIT_OK
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(daemon.serve)
            if supervisor.is_shard():
                nursery.start_soon(supervisor.watch_supervisor)
            print(listening_line(url("wss" if daemon.tls is not None else "ws", host, port)), flush=True)
            draining = False
            async for signum in signals:
                name = signal.Signals(signum).name
                if draining:
                    log.warning("received %s again while draining: stopping at once", name)
                    status = EXIT_FAILURE
                    nursery.cancel_scope.cancel()
                    break
                draining = True
                log.info(
                    "received %s, draining (up to %g s; a second signal stops at once)",
                    name,
                    daemon.settings.drain_grace,
                )
                nursery.start_soon(_drain_and_stop, daemon, nursery.cancel_scope)
    return status


async def _drain_and_stop(daemon: Daemon, scope: trio.CancelScope) -> None:
    await daemon.drain()
    scope.cancel()


# Collections of the youngest objects after this many allocations (Python's default: 700), and of
# the older generations after this many of the younger ones' (default: 10 and 10).
GC_THRESHOLDS: Final = (10_000, 50, 100)


def _tune_garbage_collection() -> None:
    """Collect cyclic garbage less often, and never scan what start-up made.

    Each session allocates thousands of objects, nearly all freed by reference counting, so
    Python's default thresholds ran a collection every few sessions, each scanning every open
    session's objects: with 4,000 sessions parked, 767 collections took 0.87 s of the daemon's
    ~6 s of CPU; with these thresholds and start-up's objects frozen, 121 took 0.11 s. Cycles
    (trio's cancelled tasks and their tracebacks) are still collected, later.
    """
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args, argv)
    except BrokenPipeError:  # stdout's reader left (`info | head`): stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE


def _run(args: argparse.Namespace, argv: list[str] | None) -> int:
    if args.command == "exec":
        return run_exec(args)
    if args.command == "mcp":
        return run_mcp(args)
    if args.command == "replay":
        return _replay(args)
    try:
        settings = config.resolve(args)
        if args.command == "info":
            return _info(settings, args.json)
        logs.configure(settings.log_level, settings.log_format == "json")
        daemon = Daemon(settings)
    except BrokenPipeError:
        raise  # info's reader went away: not a configuration error
    except (config.InvalidSetting, ConfigurationError, OSError, ssl.SSLError) as exc:
        print(f"execbox-runner: {exc}", file=sys.stderr)
        return EXIT_USAGE
    processes = settings.processes or default_processes(usable_cores())
    status = EXIT_OK
    try:
        if processes > 1 and not supervisor.is_shard():
            del daemon  # checked the settings; the shards serve
            return trio.run(
                supervisor.Supervisor(list(argv if argv is not None else sys.argv[1:]), settings, processes).run
            )
        _tune_garbage_collection()
        status = trio.run(_serve_until_signalled, daemon)
    except* OSError as group:  # e.g. the port is taken
        cause: BaseException = group
        while isinstance(cause, BaseExceptionGroup):
            cause = cause.exceptions[0]
        address = cause.address if isinstance(cause, CannotListen) else f"{settings.host}:{settings.port}"
        print(
            f"execbox-runner: cannot serve on {address}: {getattr(cause, 'strerror', None) or cause}", file=sys.stderr
        )
        status = EXIT_FAILURE
    except* KeyboardInterrupt:
        status = EXIT_FAILURE  # Ctrl-C before the signal handlers were in place: stopped at once
    return status
