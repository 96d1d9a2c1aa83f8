"""``execbox-runner exec``: run JavaScript from a shell, on a private local runner or a remote one.

The guest's logs go to stderr as it writes them (from a runner with live logs; else at its
end) and its result, as JSON, to stdout, so the output can be piped. ``CODE_OR_FILE`` is code, a file or ``-`` (stdin), by the
rule in ``CODE_OR_FILE_HELP``.

Exit status (the scheme of every command, ``exit_statuses``): 0 the execution
succeeded; 1 it failed: a guest error (including its timeout), Ctrl-C (which
cancels it), or a runner that could not be reached, went away, is busy or refused a tenant at a
quota (HTTP 429); 2 a usage error: a bad flag or
value, a file that cannot be read, or a runner that refused the request as
invalid (HTTP 401 or 403, or the execute's own limits above its maxima).
"""

from __future__ import annotations

import argparse
import json
import math
import ssl
import sys
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ..commandline import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    HelpFormatter,
    UsageError,
    exit_statuses,
    milliseconds,
)
from .environment import TOKEN_ENV, URL_ENV, from_environment
from .errors import QuotaExceeded, RunnerBusy, RunnerError, RunnerRefused, RunnerUnavailable, Unauthorized
from .runner import DEFAULT_LIMITS, Runner

if TYPE_CHECKING:
    import tree_sitter

PROG: Final = "execbox-runner exec"
SCRIPT_SUFFIXES: Final = (".js", ".mjs", ".cjs", ".ts")
PATH_PREFIXES: Final = ("./", "../", "/", "~/")
REGEX_FLAGS: Final = frozenset("dgimsuvy")
CODE_OR_FILE_HELP: Final = (
    "guest code, a file holding it, or - for stdin. It is a file when it names an existing one, and is taken for a"
    f" file (a missing one is an error) when it is one word that ends in {', '.join(SCRIPT_SUFFIXES)}, or that"
    f" starts with {', '.join(PATH_PREFIXES)} and is not valid JavaScript (/x/.test('x') is code). Anything else is code."
)


# ---------------------------------------------------------------- exec


def add_exec_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "exec",
        help="run JavaScript on a runner (a private local one by default); print its logs and result",
        description="Run JavaScript on a runner (a private local one by default). The guest's logs go to stderr"
        " as it writes them, its result as JSON to stdout.",
        formatter_class=HelpFormatter,
        epilog=exit_statuses(
            failure="the execution failed (a guest error or its timeout), was interrupted (Ctrl-C cancels it),"
            " or the runner could not be reached, went away, is busy or refused a tenant at a quota (HTTP 429)",
            usage="a bad flag or value, a file that cannot be read, a runner that refused the request"
            " (HTTP 401/403, limits above its maxima)",
        )
        + """

examples:
  execbox-runner exec '6 * 7'
  execbox-runner exec ./guest.js --timeout-ms 1000
  echo 'console.log("hi")' | execbox-runner exec -
  EXECBOX_RUNNER_TOKEN=... execbox-runner exec --url wss://runner.example:8765/ 'await 1'""",
    )
    parser.add_argument("code", metavar="CODE_OR_FILE", help=CODE_OR_FILE_HELP)
    runner = parser.add_argument_group("Runner")
    runner.add_argument(
        "--url",
        help=f"a running runner, ws://HOST:PORT/ or wss://... (default: ${URL_ENV}, else a private local runner)",
    )
    runner.add_argument("--token", help=f"bearer token for --url (default: ${TOKEN_ENV})")
    limits = parser.add_argument_group("Limits")
    limits.add_argument(
        "--timeout-ms",
        type=milliseconds,
        default=DEFAULT_LIMITS["timeout_ms"],
        metavar="MS",
        help="the execution's time budget, tool calls included (default: %(default)g)",
    )


def run_exec(args: argparse.Namespace) -> int:
    try:
        code = read_code(args.code)
        url = args.url or from_environment(URL_ENV, PROG)
        token = args.token or from_environment(TOKEN_ENV, PROG)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # Ctrl-C while reading the code: nothing ran
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_FAILURE
    try:
        # The private runner takes any --timeout-ms: it serves this one execution.
        limit = ("--max-timeout-ms", str(math.ceil(args.timeout_ms)))
        with Runner.connect(url, token=token) if url else Runner.local(daemon_args=limit) as runner:
            result = runner.execute_sync(code, timeout_ms=args.timeout_ms, on_log=_log_line)
    except ValueError as exc:  # a URL that is not ws:// or wss://, a token that cannot be sent
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RunnerError as exc:
        print(f"{PROG}: {exc}{advice(exc, token, private_runner=True)}", file=sys.stderr)
        return exit_status(exc)
    except KeyboardInterrupt:  # Ctrl-C: leaving the execution cancelled it on the runner
        print(f"{PROG}: interrupted: the execution was cancelled", file=sys.stderr)
        return EXIT_FAILURE
    if result.error is not None:
        if result.refused:
            print(
                f"{PROG}: the runner refused the execution ({result.error.code}): {result.error.message}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        print(f"error: {result.error.code}: {result.error.message}", file=sys.stderr)
        return EXIT_FAILURE
    print(json.dumps(result.result, ensure_ascii=False))  # an undefined result prints as null
    return EXIT_OK


def _log_line(line: str) -> None:
    """A guest's log line on stderr, as it is written (on a runner with live logs)."""
    print(line, file=sys.stderr, flush=True)


def exit_status(error: RunnerError) -> int:
    """2 for a runner that refused the request as invalid (an HTTP 4xx: the token, the Origin),
    1 for one that could not run it (unreachable, gone, busy, its tenant at a quota, or failing):
    a refusal that passes with time (503, 429) is no usage error."""
    transient = isinstance(error, RunnerBusy | QuotaExceeded)
    if isinstance(error, RunnerRefused) and not transient and 400 <= error.status < 500:
        return EXIT_USAGE
    return EXIT_FAILURE


def advice(error: RunnerError, token: str | None, *, private_runner: bool = False) -> str:
    """What to do about ``error``, appended to its line for a person at a shell: the token a runner
    wants, a runner to start, a certificate authority to trust; empty when there is nothing to add.
    ``private_runner``: the command runs on a private runner of its own when given no URL."""
    if isinstance(error, Unauthorized):
        if token:
            return "; the token given is not one this runner accepts"
        return f"; this runner needs a token: give it with --token or ${TOKEN_ENV}"
    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None:  # the transport raises RunnerUnavailable from the socket's or TLS's error
        chain.append(link)
        link = link.__cause__
    if isinstance(error, RunnerUnavailable) and any(isinstance(cause, ConnectionRefusedError) for cause in chain):
        private = ", or give no URL to run on a private one" if private_runner else ""
        return f"; start a runner there with 'execbox-runner serve'{private}"
    if any(isinstance(cause, ssl.SSLCertVerificationError) for cause in chain):
        return "; to trust the certificate authority that signed it, set SSL_CERT_FILE to its PEM file"
    return ""


def read_code(argument: str) -> str:
    """The guest code ``argument`` stands for (see ``CODE_OR_FILE_HELP``); ``UsageError`` for a file
    that cannot be read, and for code (from stdin, a file or the argument) that is not UTF-8 text."""
    if argument == "-":
        try:
            return sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError("cannot read stdin: not UTF-8 text") from None
    if not _is_file(argument):
        try:
            argument.encode("utf-8")  # the bytes of an argument that does not decode are surrogates
        except UnicodeEncodeError:
            raise UsageError("the code is not UTF-8 text") from None
        if not looks_like_a_path(argument):
            return argument
    path = Path(argument).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {argument}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"cannot read {argument}: not UTF-8 text") from None


def _is_file(argument: str) -> bool:
    try:
        return Path(argument).is_file()
    except (OSError, ValueError):  # not a possible path (too long, NUL bytes)
        return False


def looks_like_a_path(argument: str) -> bool:
    """One word that ends in a script suffix, or starts like a path and is not JavaScript."""
    if not argument or any(char.isspace() for char in argument):
        return False
    if argument.endswith(SCRIPT_SUFFIXES):
        return True
    return argument.startswith(PATH_PREFIXES) and not is_javascript(argument)


def is_javascript(code: str) -> bool:
    """Whether ``code`` parses as JavaScript (tree-sitter's grammar, and regular expression flags
    the language allows: ``/tmp/x`` parses as a regex with the flag ``x``, which JavaScript refuses)."""
    tree = _parser().parse(code.encode())
    if tree.root_node.has_error:
        return False
    nodes = [tree.root_node]
    while nodes:
        node = nodes.pop()
        if node.type == "regex_flags":
            flags = (node.text or b"").decode()
            if not set(flags) <= REGEX_FLAGS or len(set(flags)) < len(flags) or {"u", "v"} <= set(flags):
                return False
        nodes.extend(node.children)
    return True


@lru_cache(maxsize=1)
def _parser() -> tree_sitter.Parser:
    import tree_sitter  # noqa: PLC0415 -- only for an argument that looks like a path
    import tree_sitter_javascript  # noqa: PLC0415

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_javascript.language()))
