"""What every command of ``execbox-runner`` shares: the exit statuses, the help's layout and the
argparse types of numeric options, so that a bad value is one line and exit 2.

Exit status, in every command: 0 success; 1 the run failed (a guest error, a runner that could not
be reached or went away); 2 a usage or configuration error.
"""

from __future__ import annotations

import argparse
import errno
import math
import re
import sys
import textwrap
from typing import Final

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
MAX_SAFE_INTEGER: Final = 2**53 - 1  # the largest limit the wire takes
MAX_PORT: Final = 65535
MAX_WAIT_S: Final = 86400  # a day: longer waits overflow the clocks of the waits themselves


def exit_statuses(failure: str | None, usage: str, ok: str = "ok") -> str:
    """The exit statuses of a command for its ``--help`` epilog, in the scheme every command follows;
    ``failure`` is ``None`` for a command that never fails once its arguments are good."""
    lines = ["exit status:", f"  0  {ok}", *([f"  1  {failure}"] if failure else [])]
    return "\n".join([*lines, f"  2  a usage or configuration error: {usage}"])


# What to do about an address a command cannot listen on, by the error's errno.
LISTEN_ADVICE: Final = {
    errno.EADDRINUSE: "another process listens there: stop it, or choose another port",
    errno.EADDRNOTAVAIL: "not an address of this host: check the host given",
}


def cannot_listen(address: str, error: OSError) -> str:
    """Why a command cannot listen on ``address``, and what to do about it, for its one line."""
    advice = LISTEN_ADVICE.get(error.errno or 0)
    return f"cannot serve on {address}: {error.strerror or error}{f' ({advice})' if advice else ''}"


def install_extra(extra: str) -> str:
    """How to install an optional extra into the environment running this command. execbox-runner
    is installed from a checkout (it is not on a package index), so the command names the checkout
    and this environment's own Python, not ``pip install execbox-runner[...]``."""
    return f"install the {extra} extra: in the checkout, {sys.executable} -m pip install -e '.[{extra}]'"


class HelpFormatter(argparse.HelpFormatter):
    """Help whose text keeps its lines: each line of a description, epilog or option's help is
    wrapped on its own (so a help can put its facts on a line of their own), an indented line of an
    example is left as written, and an exit status's line wraps under its text."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        lines = (textwrap.wrap(paragraph, width, break_on_hyphens=False) or [""] for paragraph in text.splitlines())
        return [line for paragraph in lines for line in paragraph]

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            status = re.match(r"\s+\d  ", line)
            if status is not None:
                head, rest = line[: status.end()], line[status.end() :]
                lines += textwrap.wrap(
                    rest, width, initial_indent=head, subsequent_indent=" " * len(head), break_on_hyphens=False
                )
            elif line.startswith(" "):
                lines.append(line)
            else:
                lines += textwrap.wrap(line, width, break_on_hyphens=False) or [""]
        return "\n".join(indent + line for line in lines)


class UsageError(Exception):
    """What the user must fix in the command line; the message is the one line they see."""


# ---------------------------------------------------------------- argparse types of numeric options


def _number(text: str, kind: type[int] | type[float], wanted: str, low: float, high: float) -> float:
    try:
        value = kind(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not low < value <= high:
        raise argparse.ArgumentTypeError(f"must be {wanted}, not {text!r}")
    return value


def milliseconds(text: str) -> float:
    """A time budget in milliseconds: a number above 0."""
    return _number(text, float, f"a number of milliseconds > 0 and <= {MAX_SAFE_INTEGER}", 0, MAX_SAFE_INTEGER)


def seconds(text: str) -> float:
    """A wait in seconds: a number above 0, at most a day."""
    return _number(text, float, f"a number of seconds > 0 and <= {MAX_WAIT_S}", 0, MAX_WAIT_S)


def count(text: str) -> int:
    """A size or a count: an integer above 0."""
    return int(_number(text, int, f"an integer > 0 and <= {MAX_SAFE_INTEGER}", 0, MAX_SAFE_INTEGER))


def port(text: str) -> int:
    """A TCP port; 0 picks a free one."""
    return int(_number(text, int, f"a port number 0-{MAX_PORT}", -1, MAX_PORT))
