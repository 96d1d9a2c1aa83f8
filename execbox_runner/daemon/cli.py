"""``execbox-runner``: the command line of the daemon.

Exit statuses of ``serve`` and ``info``: 0 a clean stop (a complete drain), 1 a
runtime failure (the port is taken, a stop forced by a second signal), 2 a
usage or configuration error, reported in one line before anything starts.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import signal
import ssl
import sys
from typing import Final, NoReturn

import trio
from execbox_runner_conformance.harness import run_transcript, summary

from .. import __version__
from ..client.cli import add_exec_parser, run_exec
from ..mcp.cli import add_mcp_parser, run_mcp
from . import config, logs, supervisor
from .listeners import CannotListen
from .machine import default_processes, usable_cores
from .server import UNSAFE_SETTINGS, ConfigurationError, Daemon, host_report, url

log = logging.getLogger("execbox_runner")
EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line (the full usage of ``serve`` is dozens)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
        prog="execbox-runner",
        description="An execbox runner daemon: runs guest JavaScript for remote hosts over WebSocket.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="serve ws://HOST:PORT/ until SIGINT or SIGTERM")
    config.add_arguments(serve_parser)
    replay_parser = commands.add_parser(
        "replay", help="play recorded sessions' host side against a runner and report differences"
    )
    replay_parser.add_argument(
        "files", nargs="+", metavar="FILE", help="recorded transcripts (*.jsonl from --record-dir)"
    )
    replay_parser.add_argument("--url", required=True, help="the runner to replay against, ws://HOST:PORT/")
    replay_parser.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for each expected runner message"
    )
    info_parser = commands.add_parser("info", help="report what this host can enforce for these settings")
    info_parser.add_argument("--json", action="store_true", help="machine-readable output")
    config.add_arguments(info_parser)
    add_exec_parser(commands)
    add_mcp_parser(commands)
    return parser


def _replay(files: list[str], url: str, timeout: float) -> int:
    """Replay with the conformance harness: one PASS/FAIL line per file, then the totals."""
    results = [run_transcript(url, path, timeout=timeout) for path in files]
    for result in results:
        print(result.line())
    print(summary(results))
    return 0 if all(result.passed for result in results) else 1


def _info(settings: config.Settings, as_json: bool) -> int:
    report = host_report(settings)
    if as_json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"execbox-runner {report['version']} on Python {report['python']} ({report['machine']})")
    print(f"profile: {report['profile']}")
    print(
        f"interrupting running guests: {'yes' if report['interrupt_running_guests'] else 'no (unresponsive workers are killed)'}"
    )
    for name, state in report["protections"].items():  # type: ignore[attr-defined]
        status = "enforced" if state["enforced"] else ("NOT ENFORCEABLE" if state["requested"] else "off")
        print(f"  {name:<20} {status}")
    print(f"network namespace made by: {report['network_mechanism']}")
    quickjs = report["quickjs"]
    freeing = "runtimes discarded whole" if quickjs["discards_runtimes"] else "runtimes freed object by object"  # type: ignore[index]
    budget = "memory budgets checked in C" if quickjs["budget_in_c"] else "memory budgets checked in Python hooks"  # type: ignore[index]
    accessors = "accessors made on first use" if quickjs["lazy_accessors"] else "accessors made with each runtime"  # type: ignore[index]
    lazy_clock = quickjs["lazy_clock"]  # type: ignore[index]
    clock = "time limit's clock read at its first check" if lazy_clock else "time limit's clock read per call"
    compiled = "compiled profile-guided" if quickjs["profile_guided"] else "compiled without a profile"  # type: ignore[index]
    arenas = f"{quickjs['arena_bytes'] // 1024} KiB arenas"  # type: ignore[index]
    print(f"quickjs-ng {quickjs['version']}: {arenas}, {freeing}, {budget}, {accessors}, {clock}, {compiled}")  # type: ignore[index]
    for warning in report["warnings"]:  # type: ignore[attr-defined]
        print(f"warning: {warning}")
    for name in report["unsafe_settings"]:  # type: ignore[attr-defined]
        print(f"UNSAFE {name}: {UNSAFE_SETTINGS[name]}")
    return EXIT_OK


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
            print(
                f"execbox-runner listening on {url('wss' if daemon.tls is not None else 'ws', host, port)}", flush=True
            )
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
    if args.command == "exec":
        return run_exec(args)
    if args.command == "mcp":
        return run_mcp(args)
    if args.command == "replay":
        return _replay(args.files, args.url, args.timeout)
    try:
        settings = config.resolve(args)
        if args.command == "info":
            return _info(settings, args.json)
        logs.configure(settings.log_level, settings.log_format == "json")
        daemon = Daemon(settings)
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
