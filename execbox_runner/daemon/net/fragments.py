"""A host's text message arriving in several frames, bounded with its frames' headers.

Empty fragments add nothing to a message but cost memory and time to take, so a message's size
counts what its frames took on the wire (``wire``), headers included, against the largest message
the daemon takes.
"""

from __future__ import annotations


class Fragments:
    """The message's bytes so far, and the bytes its frames took on the wire."""

    __slots__ = ("data", "wire")

    def __init__(self, first: bytes) -> None:
        self.data = bytearray(first)
        self.wire = _wire_bytes(len(first))

    def add(self, payload: bytes) -> None:
        self.data += payload
        self.wire += _wire_bytes(len(payload))


def _wire_bytes(length: int) -> int:
    """What a host's frame with ``length`` bytes of payload takes on the wire: the header, its
    extended length, the mask (hosts mask every frame) and the payload."""
    return 6 + (0 if length < 126 else 2 if length < 65536 else 8) + length
