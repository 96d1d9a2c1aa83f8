"""``execbox-runner replay``: play recorded sessions' host side against a runner, with the
conformance kit, and report where its answers differ.

Exit status: 0 every session replayed as recorded; 1 a session differed or could not be replayed
(the runner lacks a protocol extension it used), or the runner could not be reached or went away; 2 a bad flag, a missing or malformed file, a runner that refused the
handshake (HTTP 401 or 403).
"""

from __future__ import annotations

import argparse
import sys
from typing import Final

import anyio
from execbox_runner_conformance.report import summary
from execbox_runner_conformance.runner import Target, TargetError, run_all
from execbox_runner_conformance.transcript import Transcript, TranscriptError, load_transcript

from ..commandline import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    HelpFormatter,
    UsageError,
    exit_statuses,
    seconds,
)
from .cli import advice, exit_status
from .environment import TOKEN_ENV, URL_ENV, from_environment
from .errors import RunnerError
from .transport import WebSocket

REPLAY_TIMEOUT_S: Final = 5.0


def add_replay_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    replay_parser = commands.add_parser(
        "replay",
        help="play recorded sessions' host side against a runner and report differences",
        description="Play the host side of recorded sessions (the *.jsonl of serve --record-dir) against a runner"
        " and report where its answers differ: one PASS or FAIL line per file, then the totals.",
        formatter_class=HelpFormatter,
        epilog=exit_statuses(
            failure="a session differed or was skipped (the runner lacks a protocol extension it used), or the"
            " runner could not be reached or went away",
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


def run_replay(args: argparse.Namespace) -> int:
    """Replay with the conformance kit: one PASS/FAIL line per file, then the totals."""
    prog = "execbox-runner replay"
    url = args.url or from_environment(URL_ENV, prog)
    token = args.token or from_environment(TOKEN_ENV, prog)
    if not url:
        print(f"{prog}: error: give the runner's URL: --url or ${URL_ENV}", file=sys.stderr)
        return EXIT_USAGE
    try:
        transcripts: list[Transcript] = [load_record(path) for path in args.files]
        anyio.run(_handshake, url, token)
    except (UsageError, TranscriptError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RunnerError as exc:
        print(f"{prog}: {exc}{advice(exc, token)}", file=sys.stderr)
        return exit_status(exc)
    headers = (("Authorization", f"Bearer {token}"),) if token else ()
    try:
        results = run_all(Target(url, headers), transcripts, timeout=args.timeout, progress=lambda r: print(r.line()))
    except TargetError as exc:  # gone since the handshake above
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    print(summary(results))
    # A skipped session (the runner lacks an extension it used) was not replayed: not a success.
    return EXIT_OK if all(result.passed for result in results) else EXIT_FAILURE


def load_record(path: str) -> Transcript:
    """A transcript to replay; ``TranscriptError`` saying so for a session's summary, which
    ``records/*`` also names."""
    if path.endswith(".summary.json"):
        raise TranscriptError(f"{path}: a session's summary, not its transcript: replay the *.jsonl files")
    return load_transcript(path)


async def _handshake(url: str, token: str | None) -> None:
    """Open and close one session, so that a runner that refuses the URL or the token is told from
    one that answers differently (a usage error, not a difference)."""
    websocket = await WebSocket.open(url, token=token)
    await websocket.close()
