"""The daemon's commands of ``execbox-runner`` (``execbox_runner.cli``): ``serve`` runs the daemon,
``info`` reports what this host enforces with the same settings.

Exit statuses (``commandline.exit_statuses``): 0 ok (for ``serve``, a clean stop after a complete
drain); 1 a port that cannot be bound, or a stop forced by a second signal; 2 a usage or
configuration error, reported in one line before anything starts: a bad flag, value or setting,
a missing file.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import signal
import ssl
import sys
from typing import Final

import trio

from ..commandline import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, HelpFormatter, cannot_listen, exit_statuses
from . import config, supervisor
from .machine import BUDGET_SHARE, default_processes, usable_cores
from .net.listeners import CannotListen
from .observability import logs
from .report import UNSAFE_SETTINGS, HostReport, accepted_tokens, host_report
from .server import ConfigurationError, Daemon, record_directory, refuse_unauthenticated, size, tls_context, url
from .startup import listening_line

log = logging.getLogger("execbox_runner")


SETTINGS_DESCRIPTION: Final = (
    "Every setting below is a flag, an environment variable EXECBOX_RUNNER_<SETTING> and a key of the --config file;"
    " a flag wins over the variable, which wins over the file."
)


def add_daemon_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``serve`` and ``info``, which take the daemon's settings."""
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
            ok="a clean stop: every execution finished or was cancelled within the drain, or a signal came"
            " before the daemon was ready",
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
    if quickjs["first_arena_bytes"] != quickjs["arena_bytes"]:
        arenas += f" (a size class's first {quickjs['first_arena_bytes'] // 1024} KiB)"
    print(f"  {arenas}, {freeing}, {budget}, {accessors}, {clock}, {compiled}")
    print(f"profile: {report['profile']}")
    for line in _limit_lines(settings, report):
        print(line)
    print(
        f"interrupting running guests: {'yes' if report['interrupt_running_guests'] else 'no (unresponsive workers are killed)'}"
    )
    print(
        f"holding running guests to a tenant's share: {'yes' if report['hold_running_guests'] else 'no (fair shares are not enforced)'}"
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

    Signals are read from the start: one that comes before the daemon is ready (its workers still
    starting, or failing to) stops it at once, as there is nothing to drain. The drain runs beside
    the signal loop, so the second signal is seen while it waits.
    Returns the exit status: 0 after a complete drain or a stop before ready, 1 when stopped at once.
    """
    status = EXIT_OK
    ready = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            # Also while it starts: a shard never outlives its supervisor, nor a private daemon its owner.
            if (parent := supervisor.parent_to_watch()) is not None:
                nursery.start_soon(supervisor.watch_parent, parent)
            nursery.start_soon(_start, daemon, nursery, ready)
            draining = False
            async for signum in signals:
                name = signal.Signals(signum).name
                if not ready.is_set():
                    log.warning("received %s before the daemon was ready: stopping", name)
                    nursery.cancel_scope.cancel()
                    break
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


async def _start(daemon: Daemon, nursery: trio.Nursery, ready: trio.Event) -> None:
    """Start serving in ``nursery``, print the listening line, and set ``ready``."""
    host, port = await nursery.start(daemon.serve)
    print(listening_line(url("wss" if daemon.tls is not None else "ws", host, port)), flush=True)
    ready.set()


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


def run_daemon_command(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``serve`` or ``info``; ``argv`` as the shards of a supervisor get it."""
    try:
        settings = config.resolve(args)
        if args.command == "info":  # what serve would refuse
            tls_context(settings)
            refuse_unauthenticated(settings, accepted_tokens(settings))
            record_directory(settings, create=False)
        else:
            logs.configure(settings.log_level, settings.log_format == "json")
            daemon = Daemon(settings)
    except (config.InvalidSetting, ConfigurationError, OSError, ssl.SSLError) as exc:
        print(f"execbox-runner: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for warning in [] if supervisor.is_shard() else config.unknown_variables():  # the supervisor's said it
        if args.command == "info":
            print(f"execbox-runner: warning: {warning}", file=sys.stderr)
        else:
            log.warning(warning)
    if args.command == "info":
        return _info(settings, args.json)  # stdout's errors are the command line's (``cli.main``)
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
        assert isinstance(cause, OSError)  # what `except* OSError` holds
        print(f"execbox-runner: {cannot_listen(address, cause)}", file=sys.stderr)
        status = EXIT_FAILURE
    except* KeyboardInterrupt:
        status = EXIT_FAILURE  # Ctrl-C before the signal handlers were in place: stopped at once
    return status
