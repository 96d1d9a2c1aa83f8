"""A plain session's WebSocket frames, read and written in one pass; websockets' for anything else.

Hosts send each message as one masked text frame, and end the session with a
close frame; the daemon answers with unmasked text frames and echoes the close.
websockets' Sans-I/O ``Protocol`` does all that through generator coroutines and
generic frame objects, a cost paid on every frame of every session (making the
protocol, the ``execute`` frame, ``started`` and ``done``, the closing handshake).
``PlainFrames`` offers the part of ``Protocol``'s interface the connection
uses and does those cases itself, as ``Protocol`` would; on anything else it
hands the bytes from that frame on to a ``Protocol`` of its own, which from then
on does everything, so that every unusual frame (ping, binary, fragment, a bad
mask, reserved bits, an oversized or unfinished frame, a close with anything but
an empty payload or code 1000 or 1001, an end of stream without a close) and every
close the daemon starts gets websockets' own answer. What is handed over starts
at a frame boundary (the frames before it were taken here, whole), and the
``Protocol`` starts in the state ``OPEN`` that ``PlainFrames`` was in. ``tests/test_plain_frames.py`` drives both with the
same bytes and calls and compares everything they answer.
"""

from __future__ import annotations

import logging
import struct
from typing import Final

from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

try:  # as websockets.frames itself: its C extension where it was built
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - a websockets without it
    from websockets.utils import apply_mask

_PLAIN_CLOSES: Final = (b"", b"\x03\xe8", b"\x03\xe9")  # no code, 1000 or 1001, no reason
_SEND_EOF: Final = b""


class PlainFrames:
    """Server-side frames of one session: the common ones here, the rest by websockets' ``Protocol``."""

    __slots__ = ("_buffer", "_eof", "_eof_sent", "_events", "_full", "_logger", "_max_size", "_state", "_writes")

    def __init__(self, *, max_size: int, logger: logging.Logger) -> None:
        self._max_size = max_size
        self._logger = logger
        self._buffer = b""  # what arrived of a frame not yet whole
        self._events: list[Frame] = []
        self._writes: list[bytes] = []
        self._state = State.OPEN
        self._eof = False
        self._full: Protocol | None = None  # websockets' protocol, once anything unusual came
        self._eof_sent = False

    # ------------------------------------------------------------------ as Protocol

    @property
    def state(self) -> State:
        return self._full.state if self._full is not None else self._state

    @property
    def eof_sent(self) -> bool:
        return self._full.eof_sent if self._full is not None else self._eof_sent

    def close_expected(self) -> bool:
        if self._full is not None:
            return self._full.close_expected()
        return self._state is State.CLOSING

    def receive_data(self, data: bytes | bytearray) -> None:
        if self._full is not None:
            self._full.receive_data(data)
            return
        if self._eof:
            raise EOFError("stream ended")
        if self._state is not State.OPEN:
            return  # after the close frame, data is discarded
        data = self._buffer + data if self._buffer else bytes(data)
        self._buffer = b""
        self._frames(data)

    def receive_eof(self) -> None:
        if self._full is not None:
            self._full.receive_eof()
            return
        if self._eof:
            return
        if self._state is State.OPEN:  # no close frame, perhaps half a frame: websockets fails the session
            self._hand_over(self._buffer).receive_eof()
            return
        self._eof = True
        self._state = State.CLOSED

    def events_received(self) -> list[Frame]:
        events, self._events = self._events, []
        if self._full is not None:
            events += self._full.events_received()  # type: ignore[arg-type]  # its events are frames
        return events

    def data_to_send(self) -> list[bytes]:
        writes, self._writes = self._writes, []
        if self._full is not None:
            writes += self._full.data_to_send()
        return writes

    def send_text(self, data: bytes) -> None:
        if self._full is not None:
            self._full.send_text(data)
            return
        if self._state is not State.OPEN:
            raise InvalidState(f"connection is {self._state.name.lower()}")
        self._writes.append(_header(0x81, len(data)) + data)

    def send_close(self, code: int, reason: str = "") -> None:
        if self._full is not None:
            self._full.send_close(code, reason)
            return
        if self._state is not State.OPEN:
            raise InvalidState(f"connection is {self._state.name.lower()}")
        self._hand_over(self._buffer).send_close(code, reason)

    # ------------------------------------------------------------------ reading

    def _frames(self, data: bytes) -> None:
        """Take the whole plain frames at the start of ``data``; keep a frame's start that is not
        whole yet; hand anything else, from its first byte on, to websockets."""
        at, end = 0, len(data)
        while at < end and self._state is State.OPEN:
            if end - at < 2:
                break
            head1, head2 = data[at], data[at + 1]
            length = head2 & 0x7F
            start = at + 6  # two bytes of header, four of mask
            if length == 126:
                if end - at < 4:
                    break
                (length,) = struct.unpack_from("!H", data, at + 2)
                start += 2
            elif length == 127:
                self._hand_over(data[at:])
                return
            # A longer frame than these may be refused on its header alone (too big): websockets does.
            plain_text = head1 == 0x81 and head2 & 0x80 and length <= self._max_size
            plain_close = head1 == 0x88 and head2 & 0x80 and length <= min(125, self._max_size)
            if not (plain_text or plain_close):
                self._hand_over(data[at:])
                return
            if end < start + length:
                break
            payload = apply_mask(data[start : start + length], data[start - 4 : start])
            if plain_text:
                self._events.append(Frame(Opcode.TEXT, payload))
            elif payload in _PLAIN_CLOSES:
                self._close(payload)
            else:
                self._hand_over(data[at:])
                return
            at = start + length
        if self._state is State.OPEN and at < end:
            self._buffer = data[at:]

    def _close(self, payload: bytes) -> None:
        """The host's close frame: echo it and end the stream, as a server does (RFC 6455, 5.5.1)."""
        self._writes.append(_header(0x88, len(payload)) + payload)
        self._writes.append(_SEND_EOF)
        self._eof_sent = True
        self._state = State.CLOSING
        self._events.append(Frame(Opcode.CLOSE, payload))

    def _hand_over(self, data: bytes) -> Protocol:
        """From here on websockets' ``Protocol`` reads and writes: ``data`` starts at a frame."""
        self._buffer = b""
        full = self._full = Protocol(Side.SERVER, max_size=self._max_size, logger=self._logger)
        if data:
            full.receive_data(data)
        return full


def _header(first: int, length: int) -> bytes:
    """An unmasked frame's header (a server's frames are never masked)."""
    if length < 126:
        return bytes((first, length))
    if length < 65536:
        return struct.pack("!BBH", first, 126, length)
    return struct.pack("!BBQ", first, 127, length)
