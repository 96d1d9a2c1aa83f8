"""The opening handshake's fast path: a plain upgrade request answered in one pass.

Hosts send their whole handshake request in one write, and nearly every one is
the same plain upgrade. websockets' Sans-I/O server reads it line by line
through generator coroutines and builds its answer in a generic ``Headers``
object, a large share of what a trivial execution costs the daemon.
``parse_upgrade`` reads such a request in one pass and
recognises only what is plainly valid: a complete ``GET`` request in HTTP/1.1,
no body, well-formed header lines, and ``Upgrade: websocket``, ``Connection``
naming ``upgrade``, one ``Sec-WebSocket-Key`` of 16 bytes and one
``Sec-WebSocket-Version: 13``. Anything else (a request still arriving, a
malformed line, a plain HTTP request, an odd header) returns None and takes
websockets' full path, so every answer to an unusual request stays websockets'
own. No WebSocket extension or subprotocol is offered on either path.
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import re
import time
from dataclasses import dataclass
from typing import Final

from websockets.datastructures import Headers
from websockets.http11 import MAX_LINE_LENGTH, MAX_NUM_HEADERS, Request
from websockets.utils import accept_key

# A request past websockets' limits (a longer line with its CRLF, more headers; its operator may
# set them) is left to it: it takes websockets' path and gets its answer (414, 431).
# HTTP's token and field-value grammars (RFC 9110), as websockets checks them; the header lines
# are checked together, each a CRLF, a name, a colon and a value (neither holds a CR or an LF).
_TOKEN: Final = re.compile(rb"[-!#$%&'*+.^_`|~0-9a-zA-Z]+")
_HEADER_LINES: Final = re.compile(rb"(?:\r\n[-!#$%&'*+.^_`|~0-9a-zA-Z]+:[\x09\x20-\x7e\x80-\xff]*)*")
_END: Final = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Upgrade:
    """A plain upgrade request: the request as websockets would have parsed it, the
    ``Sec-WebSocket-Accept`` that answers its key, and the bytes that followed it (frames the
    host sent at once)."""

    request: Request
    accept: str
    rest: bytes | bytearray


def parse_upgrade(data: bytes | bytearray) -> Upgrade | None:
    """``data``, the first bytes of a connection, as a plain upgrade request; None when it is
    anything else (see the module docstring)."""
    end = data.find(_END)
    if end < 0:
        return None
    head = data[:end]
    first = head.find(b"\r\n")
    if first < 0:
        return None  # no header lines: no upgrade asked for
    parts = head[:first].split(b" ")
    if len(parts) != 3 or parts[0] != b"GET" or parts[2] != b"HTTP/1.1" or not parts[1].isascii():
        return None
    if not _HEADER_LINES.fullmatch(head, first):
        return None
    lines = head[first + 2 :].decode("iso-8859-1").split("\r\n")
    if len(lines) > MAX_NUM_HEADERS or max(first, *map(len, lines)) + 2 > MAX_LINE_LENGTH:
        return None
    headers = Headers()
    for line in lines:
        name, _, value = line.partition(":")
        headers[name] = value.strip(" \t")
    accept = _accept_key(headers)
    if accept is None:
        return None
    return Upgrade(Request(parts[1].decode("ascii"), headers), accept, data[end + len(_END) :])


def _accept_key(headers: Headers) -> str | None:
    """The ``Sec-WebSocket-Accept`` for headers that plainly ask for a WebSocket; else None."""
    if "Transfer-Encoding" in headers or "Content-Length" in headers:
        return None  # a body: websockets says what it makes of one
    upgrades = headers.get_all("Upgrade")
    if len(upgrades) != 1 or upgrades[0].lower() != "websocket":
        return None
    options = [option.strip(" \t").lower() for value in headers.get_all("Connection") for option in value.split(",")]
    if "upgrade" not in options or not all(_TOKEN.fullmatch(option.encode()) for option in options):
        return None
    keys, versions = headers.get_all("Sec-WebSocket-Key"), headers.get_all("Sec-WebSocket-Version")
    if len(keys) != 1 or versions != ["13"]:
        return None
    try:
        if len(base64.b64decode(keys[0].encode("ascii"), validate=True)) != 16:
            return None
    except (binascii.Error, UnicodeEncodeError):
        return None
    return accept_key(keys[0])


def response(accept: str, request_id: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """The 101 that opens the session: the headers websockets' answer has, in its order, the
    session's ``X-Request-Id``, and ``extra`` headers (plain tokens: nothing a host sent)."""
    lines = "".join(f"{name}: {value}\r\n" for name, value in extra)
    return (
        f"HTTP/1.1 101 Switching Protocols\r\nDate: {_http_date()}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\nX-Request-Id: {request_id}\r\n{lines}\r\n"
    ).encode("ascii")


_date: tuple[int, str] = (0, "")


def _http_date() -> str:
    """The ``Date`` header's value, formatted once a second rather than once a session."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, email.utils.formatdate(now, usegmt=True))
    return _date[1]
