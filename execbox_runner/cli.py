"""``execbox-runner``: the command line of the daemon."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

import trio

from . import config
from .server import serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="execbox-runner", description="An execbox runner daemon: runs guest JavaScript for remote hosts over WebSocket.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="serve ws://HOST:PORT/ until SIGINT or SIGTERM")
    config.add_arguments(serve_parser)
    return parser


async def _serve_until_signalled(settings: config.Settings) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve, settings)
            shown = f"[{host}]" if ":" in host else host
            print(f"execbox-runner listening on ws://{shown}:{port}/", flush=True)
            async for signum in signals:
                logging.getLogger("execbox_runner").info("received %s, stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = config.resolve(args)
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("websockets").setLevel(logging.WARNING)
    status = 0
    try:
        trio.run(_serve_until_signalled, settings)
    except* OSError as group:  # e.g. the port is taken
        exc: BaseException = group
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
        print(f"execbox-runner: cannot serve on {settings.host}:{settings.port}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        status = 1
    except* KeyboardInterrupt:
        pass  # a second signal while stopping: we are stopping anyway
    return status


if __name__ == "__main__":
    sys.exit(main())
