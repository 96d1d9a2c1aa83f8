"""The ``execbox-conformance`` command: options, selection, and the exit status CI acts on.

Exit status: 0 when every selected transcript passed, or was skipped for needing a protocol
extension the runner does not offer; 1 when any failed; 2 when no verdict was possible: a usage
error, a malformed or missing transcript, nothing selected, every transcript skipped, or a runner
that cannot be reached or refuses the handshake. The last kinds are one line on stderr, never
a traceback, because they are what a user fixes first (URL, token, certificate).
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import re
import ssl
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Final, NoReturn

from websockets.exceptions import InvalidURI
from websockets.uri import parse_uri

from .report import describe, json_report, junit_xml, summary
from .runner import DEFAULT_TIMEOUT, Result, Target, TargetError, run_all
from .transcript import BUILTIN_TRANSCRIPTS, Transcript, TranscriptError, discover

__all__ = ["DEPRECATED_TOKEN_ENV", "TOKEN_ENV", "URL_ENV", "build_parser", "main"]

PROG: Final = "execbox-conformance"
MAX_TIMEOUT: Final = 86400  # seconds: a day
#: Where the runner's URL comes from when none is given: the name every execbox-runner client reads.
URL_ENV: Final = "EXECBOX_RUNNER_URL"
#: Where the bearer token comes from when ``--token`` is not given (keeps it out of process listings).
TOKEN_ENV: Final = "EXECBOX_RUNNER_TOKEN"  # noqa: S105 (the variable's name, not a secret)
#: The token's earlier name, still read (with a warning) when ``TOKEN_ENV`` is unset.
DEPRECATED_TOKEN_ENV: Final = "EXECBOX_CONFORMANCE_TOKEN"  # noqa: S105
# RFC 9110 token characters: what a header name may be made of.
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class UsageError(Exception):
    """The command was given something it cannot work with; no transcript was run."""


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, like the kit's other errors (CI logs show that line)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _kit_version() -> str:
    """The version of the execbox-runner distribution that ships this kit, for a CI log to name the
    kit that checked a runner."""
    try:
        return version("execbox-runner")
    except PackageNotFoundError:  # run from a checkout (python -m conformance) without installing it
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Replay execbox golden transcripts against a runner and check its answers.",
        epilog="Exit status: 0 all selected transcripts passed (or were skipped: an extension the runner "
        "does not offer), 1 some failed, "
        "2 no verdict (usage, transcripts, or the runner cannot be reached). "
        f"Transcript format: {BUILTIN_TRANSCRIPTS / 'README.md'}",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_kit_version()}")
    parser.add_argument(
        "url",
        nargs="?",
        help=f"the runner's WebSocket URL, e.g. ws://127.0.0.1:8765/ or wss://... (default: ${URL_ENV})",
    )
    connection = parser.add_argument_group("connection")
    connection.add_argument(
        "--token", help=f"send 'Authorization: Bearer TOKEN' in the handshake (default: ${TOKEN_ENV}, if set)"
    )
    connection.add_argument(
        "--header",
        dest="headers",
        action="append",
        type=_header,
        default=[],
        metavar="NAME:VALUE",
        help="add a header to the handshake (repeatable), e.g. Origin:https://host.example",
    )
    tls = connection.add_mutually_exclusive_group()
    tls.add_argument("--cafile", type=Path, metavar="PATH", help="wss://: trust the CA certificates in PATH (PEM)")
    tls.add_argument("--insecure", action="store_true", help="wss://: do not verify the runner's certificate")
    connection.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds to wait for each expected runner frame (default {DEFAULT_TIMEOUT:g})",
    )
    selection = parser.add_argument_group("selection")
    selection.add_argument(
        "--transcripts",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="also run the *.jsonl transcripts in DIR (repeatable)",
    )
    selection.add_argument(
        "--no-builtin", action="store_true", help="run only the --transcripts directories, not the built-in ones"
    )
    selection.add_argument(
        "-k",
        dest="select",
        action="append",
        default=[],
        metavar="SUBSTRING",
        help="only transcripts whose file name contains SUBSTRING (repeatable: any match selects)",
    )
    selection.add_argument("--list", action="store_true", help="print the selected transcripts and connect to nothing")
    output = parser.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="results as JSON on stdout (progress goes to stderr)")
    output.add_argument("--junit-xml", type=Path, metavar="FILE", help="also write a JUnit XML report to FILE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        status = _main(args)
        sys.stdout.flush()  # what is still buffered: a full disk or a closed pipe shows here
    except (UsageError, TranscriptError, TargetError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.ENOSPC):
            raise
        # stdout's reader left (`| head`): stop quietly, as other tools do; a full one is said
        if exc.errno == errno.ENOSPC:
            print(f"{PROG}: cannot write to stdout: {exc.strerror}", file=sys.stderr)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 1
    return status


def _main(args: argparse.Namespace) -> int:
    if args.url is None and not args.list:
        args.url = os.environ.get(URL_ENV) or None
    target = _target(args) if args.url is not None else None
    if args.no_builtin and not args.transcripts:
        raise UsageError("--no-builtin needs at least one --transcripts DIR")
    transcripts = discover(args.transcripts, builtin=not args.no_builtin, select=args.select)
    if not transcripts and args.select:
        raise UsageError(f"no transcript's file name contains {' or '.join(map(repr, args.select))}")
    if not transcripts:
        raise UsageError(f"no built-in transcripts in {BUILTIN_TRANSCRIPTS} (a broken installation?)")
    if args.list:
        _print_list(transcripts, as_json=args.json)
        return 0
    if target is None:
        raise UsageError(f"the runner's URL is missing (e.g. ws://127.0.0.1:8765/, or ${URL_ENV}); --list needs none")
    progress = sys.stderr if args.json else sys.stdout

    def report(result: Result) -> None:
        print(result.line(), file=progress, flush=True)

    results = run_all(target, transcripts, timeout=args.timeout, progress=report)
    print(summary(results), file=progress, flush=True)
    if args.junit_xml is not None:
        try:
            args.junit_xml.write_bytes(junit_xml(results, target.url))
        except OSError as exc:
            raise UsageError(f"cannot write --junit-xml {args.junit_xml}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(json_report(results, target.url), indent=2), flush=True)
    if results and all(result.skipped for result in results):
        raise UsageError("no verdict: every selected transcript needs a protocol extension the runner does not offer")
    return 1 if any(result.failed for result in results) else 0


def _print_list(transcripts: Sequence[Transcript], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps({"transcripts": [describe(transcript) for transcript in transcripts]}, indent=2))
        return
    width = max(len(transcript.name) for transcript in transcripts)
    for transcript in transcripts:
        print(f"{transcript.name:<{width}}  {transcript.description}".rstrip())


def _target(args: argparse.Namespace) -> Target:
    """The runner to reach, checked before anything runs so that a wrong URL or option is one clear line."""
    url: str = args.url
    try:
        secure = parse_uri(url).secure
    except InvalidURI as exc:
        raise UsageError(f"invalid URL {url!r}: {exc.msg} (expected ws://HOST:PORT/ or wss://HOST:PORT/)") from None
    headers: list[tuple[str, str]] = args.headers
    token: str | None = args.token or _token_from_environment()
    if token is not None:
        if any(name.lower() == "authorization" for name, _ in headers):
            raise UsageError("give the token either with --token (or $" + TOKEN_ENV + ") or as an Authorization header")
        if not token.isprintable() or any(char.isspace() for char in token):
            raise UsageError("the token must be printable, without spaces or line breaks")
        headers = [("Authorization", f"Bearer {token}"), *headers]
    return Target(url, tuple(headers), _tls(args, secure=secure))


def _token_from_environment() -> str | None:
    """``TOKEN_ENV``, else the deprecated ``DEPRECATED_TOKEN_ENV`` with a warning naming the new one."""
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV]
    if os.environ.get(DEPRECATED_TOKEN_ENV):
        print(f"{PROG}: warning: {DEPRECATED_TOKEN_ENV} is deprecated; set {TOKEN_ENV} instead", file=sys.stderr)
        return os.environ[DEPRECATED_TOKEN_ENV]
    return None


def _tls(args: argparse.Namespace, *, secure: bool) -> ssl.SSLContext | None:
    """``None`` leaves websockets' default: the system's CAs, with the host name checked."""
    if args.cafile is None and not args.insecure:
        return None
    if not secure:
        raise UsageError("--cafile and --insecure are for wss:// URLs")
    if args.insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    try:
        return ssl.create_default_context(cafile=args.cafile)
    except OSError as exc:  # ssl.SSLError is an OSError too
        raise UsageError(f"cannot load --cafile {args.cafile}: {exc.strerror or exc}") from None


def _header(text: str) -> tuple[str, str]:
    name, colon, value = text.partition(":")
    if not colon or not _HEADER_NAME.fullmatch(name):
        raise argparse.ArgumentTypeError(f"expected NAME:VALUE, got {text!r}")
    value = value.strip()
    if not value.isprintable():
        raise argparse.ArgumentTypeError(f"the value of {name} must be printable, without line breaks")
    return name, value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT:  # longer overflows the waits' clocks
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds up to {MAX_TIMEOUT}, got {text!r}")
    return value


if __name__ == "__main__":
    sys.exit(main())
