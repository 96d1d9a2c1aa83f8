"""Who a listener lets in, the same for the daemon and for code mode over HTTP: a loopback address
is served without a token, and bearer tokens come from a comma-separated value plus a file."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Final

# Why a token is refused: a client could never send it (a space or a newline would end the header).
UNSENDABLE: Final = "the token must be printable ASCII without spaces, and not empty"


def sendable(token: str) -> bool:
    """Whether ``token`` can be sent as a bearer token, the one rule of the clients and the daemon."""
    return bool(token) and token.isascii() and token.isprintable() and " " not in token


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address to listen on) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_tokens(inline: str, path: str) -> tuple[bytes, ...]:
    """Bearer tokens: ``inline`` comma-separated, and the lines of the file at ``path`` (``#``
    comments). Raises OSError for a file that cannot be read, UnicodeDecodeError for one that is
    not UTF-8, ValueError (naming the line, never the token) for a token no client could send."""
    entries = token_entries(inline, path)
    for entry, where in entries:
        check_sendable(entry, where)
    return tuple(entry.encode() for entry, _ in entries)


def check_sendable(token: str, where: str) -> None:
    """ValueError, naming ``where`` (a line of a file, or ``""``), for a token no client could send."""
    if not sendable(token):
        raise ValueError(f"{where}: {UNSENDABLE}" if where else UNSENDABLE)


def token_entries(inline: str, path: str) -> list[tuple[str, str]]:
    """The entries of a tokens setting, each with where it came from (``""`` inline, ``line N`` of
    the file): ``inline`` comma-separated, then the file's lines, stripped, blank lines and ``#``
    comments left out. Raises OSError for a file that cannot be read, UnicodeDecodeError for one
    that is not UTF-8."""
    entries = [(token.strip(), "") for token in inline.split(",")]
    if path:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        entries += [(line.strip(), f"line {number}") for number, line in enumerate(lines, start=1)]
    return [(entry, where) for entry, where in entries if entry and not entry.startswith("#")]
