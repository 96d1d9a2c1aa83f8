"""One accepted connection's bytes, plain or TLS, served by the reactor.

What arrives is handed to the connection as it arrives. What the reactor's
pass writes to a peer goes to the kernel in one system call at the pass's end
(at once outside a pass), which takes it whole unless the peer has stopped reading;
whatever it does not take waits, in order, and meanwhile nothing more is read
from the peer (a peer cannot make the daemon buffer answers it does not read).
If the peer has not taken it all within the send timeout it is dropped. A close
waits for what is left to be written; after a closing handshake, a peer that
still sent bytes gets a lingering close (``linger``).

TLS runs over memory buffers (``ssl.SSLObject``): the handshake completes
before the connection sees any data, and a close sends TLS's close_notify.
"""

from __future__ import annotations

import os
import socket
import ssl
from typing import Final, Protocol

from .reactor import READ, WRITE, Reactor, Timer

RECEIVE_BYTES: Final = 65536


class Receiver(Protocol):
    """What a transport tells its connection."""

    def received(self, data: bytes) -> None:
        """Bytes from the peer (after TLS, plaintext)."""

    def ended(self) -> None:
        """The peer closed its side."""

    def lost(self, reason: str | None) -> None:
        """The connection is gone: broken (``reason`` says how), or dropped by us (None)."""

    def stalled(self) -> None:
        """The peer took nothing written to it for the send timeout: it is being dropped (``lost(None)`` follows)."""


class Transport:
    """A non-blocking socket registered with the reactor, and its connection."""

    __slots__ = (
        "_backlog",
        "_closing",
        "_linger_s",
        "_queued",
        "_queued_bytes",
        "_reactor",
        "_receiver",
        "_send_timeout",
        "_sock",
        "_timer",
        "_tls",
        "_tls_done",
        "_tls_in",
        "_tls_out",
        "fd",
    )

    def __init__(
        self,
        reactor: Reactor,
        sock: socket.socket,
        receiver: Receiver,
        *,
        send_timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._reactor = reactor
        self._sock = sock
        self.fd = sock.fileno()
        self._receiver = receiver
        self._send_timeout = send_timeout
        self._queued: list[bytes] | None = None  # written in this pass of the reactor, for its end
        self._queued_bytes = 0
        self._backlog: bytearray | None = None  # what the kernel has not taken yet, in order
        self._timer: Timer | None = None  # the send timeout while backlogged; the linger's bound
        self._closing = False  # close once the backlog is written
        self._linger_s: float | None = None  # closing: at most this long to read what the peer still sends
        self._tls: ssl.SSLObject | None = None
        self._tls_in = self._tls_out = None
        self._tls_done = False  # its handshake is complete
        if tls is not None:
            self._tls_in, self._tls_out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self._tls = tls.wrap_bio(self._tls_in, self._tls_out, server_side=True)
        reactor.register(self.fd, READ, self._ready)

    @property
    def open(self) -> bool:
        return self.fd >= 0

    @property
    def backlog(self) -> int:
        """Bytes written that the peer has not taken yet."""
        return self._queued_bytes + (len(self._backlog) if self._backlog is not None else 0)

    def has_sent(self) -> bool:
        """Whether bytes from the peer wait unread (peeked, not consumed)."""
        try:
            return self.fd >= 0 and bool(self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:  # nothing yet (EAGAIN), or broken
            return False

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        """Send ``data`` after what was written before it (see the module docstring)."""
        if self.fd < 0 or self._closing:
            return
        self._queued_bytes += len(data)
        if self._queued is not None:
            self._queued.append(data)
            return
        self._queued = [data]
        self._reactor.later(self._flush)

    def _flush(self, last: bool = False) -> None:
        """``last``: the close follows at once (see ``_send``)."""
        queued, self._queued, self._queued_bytes = self._queued, None, 0
        if not queued or self.fd < 0:
            return
        data = queued[0] if len(queued) == 1 else b"".join(queued)
        if self._tls is not None:
            try:
                self._tls.write(data)
            except ssl.SSLError as exc:
                self._fail(f"TLS: {exc}")
                return
            self._send(self._tls_pending(), last)
        else:
            self._send(data, last)

    def _send(self, data: bytes, last: bool = False) -> None:
        """``last``: the close follows at once, so the kernel holds the bytes (``MSG_MORE``) and
        sends them with the FIN in one segment (on loopback, one segment fewer saves ~4 us)."""
        if not data:
            return
        if self._backlog is not None:
            self._backlog += data
            return
        try:
            sent = self._sock.send(data, socket.MSG_MORE) if last else os.write(self.fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._fail(f"socket connection broken: {exc}")
            return
        if sent < len(data):
            self._backlog = bytearray(memoryview(data)[sent:])
            self._reactor.modify(self.fd, WRITE)  # and read nothing more until it is written
            self._timer = self._reactor.call_at(self._reactor.now() + self._send_timeout, self._stopped_reading)

    def _drain(self) -> None:
        assert self._backlog is not None
        try:
            sent = os.write(self.fd, self._backlog)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"socket connection broken: {exc}")
            return
        del self._backlog[:sent]
        if self._backlog:
            return
        self._backlog = None
        self._cancel_timer()
        if self._closing:
            self._finish_close()
        else:
            self._reactor.modify(self.fd, READ)

    def _stopped_reading(self) -> None:
        self._timer = None
        self._receiver.stalled()
        self.abort()
        self._receiver.lost(None)

    # ------------------------------------------------------------------ reading

    def _ready(self, _mask: int) -> None:
        if self._backlog is not None:  # writable, or broken: the write says which
            self._drain()
        else:
            self.read_now()

    def read_now(self) -> None:
        """Read what has arrived, if anything, and hand it on."""
        if self.fd < 0 or self._backlog is not None:
            return
        try:
            data = os.read(self.fd, RECEIVE_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"socket connection broken: {exc}")
            return
        if self._linger_s is not None:  # closing: what the peer still sends is discarded
            if not data:
                self.abort()
            return
        if self._tls is not None:
            self._tls_received(data)
        elif data:
            self._receiver.received(data)
        else:
            self._receiver.ended()

    def _tls_received(self, data: bytes) -> None:
        assert self._tls is not None and self._tls_in is not None
        if data:
            self._tls_in.write(data)
        else:
            self._tls_in.write_eof()
        plaintext: list[bytes] = []
        ended = False
        try:
            if not self._tls_done:
                self._tls.do_handshake()
                self._tls_done = True
            while chunk := self._tls.read(RECEIVE_BYTES):
                plaintext.append(chunk)
            ended = True  # b"": the peer's close_notify
        except ssl.SSLWantReadError:
            ended = not data
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            ended = True
        except ssl.SSLError as exc:
            self._send(self._tls_pending())  # the alert, if any
            self._fail(f"TLS: {exc.reason or exc}")
            return
        self._send(self._tls_pending())  # the handshake's answers
        if plaintext and self.fd >= 0:
            self._receiver.received(b"".join(plaintext))
        if ended and self.fd >= 0:
            self._receiver.ended()

    def _tls_pending(self) -> bytes:
        assert self._tls_out is not None
        return self._tls_out.read()

    # ------------------------------------------------------------------ closing

    def close(self, linger_s: float | None = None) -> None:
        """Close once everything written has gone. ``linger_s``: after a closing handshake, a peer
        whose bytes are still unread is read (and its bytes discarded) up to this long first:
        closing a socket with unread data resets the connection, and the reset can overtake the
        close frame. TLS has no half-close, so there is nothing to linger for."""
        if self.fd < 0 or self._closing:
            return
        self._flush(last=self._tls is None)
        if self.fd < 0:  # the flush found the connection broken
            return
        self._closing = True
        if linger_s is not None and self._tls is None:
            self._linger_s = linger_s
        if self._tls is not None:
            try:
                self._tls.unwrap()  # close_notify
            except ssl.SSLError:
                pass
            self._send(self._tls_pending(), last=True)
        if self.fd >= 0 and self._backlog is None:
            self._finish_close()

    def _finish_close(self) -> None:
        if self._linger_s is not None and self.has_sent():
            try:
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                self.abort()
                return
            self._reactor.modify(self.fd, READ)
            self._timer = self._reactor.call_at(self._reactor.now() + self._linger_s, self.abort)
            return
        self.abort()

    def abort(self) -> None:
        """Close now, whatever is left unwritten."""
        if self.fd < 0:
            return
        self._cancel_timer()
        self._reactor.unregister(self.fd)
        self.fd = -1
        self._queued, self._queued_bytes, self._backlog = None, 0, None
        self._sock.close()

    def _fail(self, reason: str) -> None:
        self.abort()
        self._receiver.lost(reason)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
