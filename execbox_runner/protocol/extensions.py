"""Extensions to the execbox protocol, which a host opts into at the WebSocket handshake.

A host lists the extensions it wants in the ``Execbox-Extensions`` request header
(comma-separated tokens, case-insensitive); the runner's 101 answer lists, in the same header,
those it turned on. A runner that knows none (execbox's own) sends no such header, so the host
knows where it stands; without the header, the wire is exactly the base protocol.

The handshake, not a field of ``execute``, because an unknown field is ignored by some runners and
refused by others, and a subprotocol offered to a runner built on Node's ``ws`` is echoed back by
default whether it is understood or not. Hosts are programs that set headers (browsers, which
cannot, are not hosts).

Known extensions:

- ``live-logs``: ``log`` messages (``messages.Log``) carry each execution's log lines while it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

HEADER: Final = "Execbox-Extensions"
LIVE_LOGS: Final = "live-logs"
KNOWN: Final = (LIVE_LOGS,)


def negotiate(offered: Sequence[str]) -> tuple[str, ...]:
    """The extensions to turn on for the values of the host's ``Execbox-Extensions`` headers:
    those this runner knows, in its own order; unknown tokens are ignored."""
    if not offered:  # most hosts offer none
        return ()
    tokens = {token.strip().lower() for value in offered for token in value.split(",")}
    return tuple(name for name in KNOWN if name in tokens)
