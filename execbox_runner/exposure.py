"""Who a listener lets in, the same for the daemon and for code mode over HTTP: a loopback address
is served without a token, and bearer tokens come from a comma-separated value plus a file."""

from __future__ import annotations

import ipaddress
from pathlib import Path


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
    comments). Raises OSError for a file that cannot be read."""
    tokens = [token.strip() for token in inline.split(",")]
    if path:
        tokens += [line.strip() for line in Path(path).read_text().splitlines()]
    return tuple(token.encode() for token in tokens if token and not token.startswith("#"))
