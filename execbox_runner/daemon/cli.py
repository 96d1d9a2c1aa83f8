"""``execbox-runner``: the command line of the daemon."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import ssl
import sys

import trio
from execbox_runner_conformance.harness import run_transcript, summary

from .. import __version__
from ..client.cli import add_exec_parser, run_exec
from . import config, logs, supervisor
from .server import ConfigurationError, Daemon, host_report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    for warning in report["warnings"]:  # type: ignore[attr-defined]
        print(f"warning: {warning}")
    return 0


async def _serve_until_signalled(daemon: Daemon) -> None:
    settings = daemon.settings
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(daemon.serve)
            if supervisor.is_shard():
                nursery.start_soon(supervisor.watch_supervisor)
            shown = f"[{host}]" if ":" in host else host
            scheme = "wss" if daemon.tls is not None else "ws"
            print(f"execbox-runner listening on {scheme}://{shown}:{port}/", flush=True)
            async for signum in signals:
                logging.getLogger("execbox_runner").info(
                    "received %s, draining (up to %g s)", signal.Signals(signum).name, settings.drain_grace
                )
                await daemon.drain()
                nursery.cancel_scope.cancel()
                break


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "exec":
        return run_exec(args)
    if args.command == "replay":
        return _replay(args.files, args.url, args.timeout)
    settings = config.resolve(args)
    if args.command == "info":
        return _info(settings, args.json)
    logs.configure(settings.log_level, settings.log_format == "json")
    processes = settings.processes or os.cpu_count() or 1
    try:
        daemon = Daemon(settings)
    except (ConfigurationError, OSError, ssl.SSLError) as exc:
        print(f"execbox-runner: {exc}", file=sys.stderr)
        return 2
    status = 0
    try:
        if processes > 1 and not supervisor.is_shard():
            del daemon  # checked the settings; the shards serve
            return trio.run(
                supervisor.Supervisor(list(argv if argv is not None else sys.argv[1:]), settings, processes).run
            )
        trio.run(_serve_until_signalled, daemon)
    except* OSError as group:  # e.g. the port is taken
        cause: BaseException = group
        while isinstance(cause, BaseExceptionGroup):
            cause = cause.exceptions[0]
        print(
            f"execbox-runner: cannot serve on {settings.host}:{settings.port}: {getattr(cause, 'strerror', None) or cause}",
            file=sys.stderr,
        )
        status = 1
    except* KeyboardInterrupt:
        pass  # a second signal while stopping: we are stopping anyway
    return status
