"""A WebSocket client connection for a scripted host, on one thread.

websockets' threaded client reads the socket on a thread of its own while the
caller writes on another. Over TLS 1.3 that is two threads in one OpenSSL
connection at once (the server's session tickets arrive as the handshake
request is written), and about one connection in 200 stalled with the request
never sent. The harness plays one step at a time anyway, so this connection
drives websockets' Sans-I/O ``ClientProtocol`` from the caller's thread alone:
it reads only inside ``recv`` and ``close``, for as long as they may wait.
"""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections.abc import Iterable
from typing import Final

from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidMessage
from websockets.frames import Frame, Opcode
from websockets.http11 import USER_AGENT, Response
from websockets.protocol import State
from websockets.uri import parse_uri

__all__ = ["Connection", "connect"]

_READ_BYTES: Final = 65536


class Connection:
    """An open WebSocket: ``send`` a message, ``recv`` the next one within a timeout, ``close``.

    ``protocol`` is websockets' state machine (its ``close_rcvd`` says whether the peer's close
    frame came). Raises websockets' ``ConnectionClosed`` once the connection is closed, as
    websockets' own connections do."""

    def __init__(self, sock: socket.socket, protocol: ClientProtocol, close_timeout: float):
        self.socket = sock
        self.protocol = protocol
        self._events: list[object] = []  # received, not yet returned
        self._fragments: list[bytes] = []  # the message being received, in pieces
        self._text = True  # and whether it is text
        self._close_timeout = close_timeout
        self.response: Response | None = None  # the runner's answer to the handshake, once it came

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def send(self, message: str | bytes, *, text: bool | None = None) -> None:
        """A text message for ``str`` and a binary one for ``bytes``; ``text=True`` sends ``bytes``
        as a text frame unchecked, as a hostile peer may (invalid UTF-8 included)."""
        if self.protocol.state is not State.OPEN:
            raise self._closed()
        if isinstance(message, str):
            self.protocol.send_text(message.encode())
        elif text:
            self.protocol.send_text(message)
        else:
            self.protocol.send_binary(message)
        self._flush()

    def recv(self, timeout: float | None = None) -> str | bytes:
        """The next message; ``TimeoutError`` if none is whole within ``timeout`` seconds, and
        ``UnicodeDecodeError`` for a text message that is not UTF-8."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while self._events:
                message = self._message(self._events.pop(0))
                if message is not None:
                    return message
            if self.protocol.state is State.CLOSED or self.protocol.close_rcvd is not None:
                raise self._closed()
            if not self._read(deadline):
                raise TimeoutError(f"no message within {timeout:g} s")

    def close(self, code: int = 1000, reason: str = "") -> list[str | bytes]:
        """Send a close frame and wait up to the close timeout for the peer's, then close the socket.
        Returns the messages ``recv`` never took: those the peer sent before it closed."""
        untaken: list[str | bytes] = []
        try:
            if self.protocol.state is State.OPEN:
                self.protocol.send_close(code, reason)
                self._flush()
            self._until_closed(untaken)
        except OSError:
            pass
        finally:
            self.socket.close()
        return untaken

    def _message(self, event: object) -> str | bytes | None:
        """A whole message from a frame, if it ends one (fragments are gathered)."""
        if not isinstance(event, Frame) or event.opcode not in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
            return None  # pings are answered by the protocol, closes end the connection
        if event.opcode is not Opcode.CONT:
            self._text, self._fragments = event.opcode is Opcode.TEXT, []
        self._fragments.append(bytes(event.data))
        if not event.fin:
            return None
        data, self._fragments = b"".join(self._fragments), []
        return data.decode() if self._text else data

    def _read(self, deadline: float | None) -> bool:
        """Read once (the events are queued); False if nothing came before ``deadline``."""
        wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        pending = isinstance(self.socket, ssl.SSLSocket) and self.socket.pending() > 0
        if not pending and not select.select([self.socket], [], [], wait)[0]:
            return False
        self.socket.settimeout(None if wait is None else max(wait, 0.01))  # a TLS record's rest
        try:
            data = self.socket.recv(_READ_BYTES)
        except TimeoutError:
            return False
        except OSError:  # reset: the connection is gone, as if ended
            data = b""
        finally:
            self.socket.settimeout(None)  # writes wait as long as they must
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()
        self._events.extend(self.protocol.events_received())
        try:
            self._flush()  # pongs, the answer to a close
        except OSError:  # the peer is gone: its end of data comes next
            pass
        return True

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.socket.sendall(data)
            else:  # the protocol's end of data
                try:
                    self.socket.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

    def _until_closed(self, untaken: list[str | bytes] | None = None) -> None:
        """Read until the peer has closed the TCP connection too, for the close timeout at most; the
        messages received and not yet taken go to ``untaken`` (a text one that is not UTF-8 as bytes)."""
        deadline = time.monotonic() + self._close_timeout
        while True:
            for event in self._events:
                try:
                    message = self._message(event)
                except UnicodeDecodeError as exc:
                    message = exc.object
                if message is not None and untaken is not None:
                    untaken.append(message)
            self._events.clear()
            if self.protocol.state is State.CLOSED or not self._read(deadline):
                return

    def _closed(self) -> ConnectionClosed:
        """What the connection's end raises: once the peer has closed the TCP connection too, or
        its close timeout has passed."""
        self._until_closed()
        if self.protocol.state is not State.CLOSED:
            self.protocol.receive_eof()
        return self.protocol.close_exc


def connect(
    url: str,
    *,
    additional_headers: Iterable[tuple[str, str]] = (),
    ssl_context: ssl.SSLContext | None = None,
    open_timeout: float = 10.0,
    close_timeout: float = 10.0,
) -> Connection:
    """Open a WebSocket to ``url`` (TCP, TLS for ``wss://``, then the handshake) within ``open_timeout``.

    Raises websockets' ``InvalidURI``, ``InvalidStatus`` or ``InvalidHandshake``, ``ssl.SSLError``,
    ``TimeoutError`` or ``OSError``, as websockets' own ``connect`` does."""
    uri = parse_uri(url)
    deadline = time.monotonic() + open_timeout
    sock = socket.create_connection((uri.host, uri.port), timeout=open_timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if uri.secure:
            context = ssl_context if ssl_context is not None else ssl.create_default_context()
            sock.settimeout(max(deadline - time.monotonic(), 0.0))
            sock = context.wrap_socket(sock, server_hostname=uri.host)
        sock.settimeout(None)  # writes wait; reads wait in select, within each call's own timeout
        protocol = ClientProtocol(uri, max_size=None)
        request = protocol.connect()
        request.headers.update(additional_headers)
        request.headers.setdefault("User-Agent", USER_AGENT)
        protocol.send_request(request)
        connection = Connection(sock, protocol, close_timeout)
        connection._flush()
        while not any(isinstance(event, Response) for event in connection._events):
            if not connection._read(deadline):
                raise TimeoutError("timed out while waiting for handshake response")
            if protocol.handshake_exc is not None:
                raise protocol.handshake_exc
            if protocol.state is State.CLOSED:
                raise InvalidMessage("did not receive a valid HTTP response")
        connection.response = next(event for event in connection._events if isinstance(event, Response))
        connection._events = [event for event in connection._events if not isinstance(event, Response)]
        return connection
    except BaseException:
        sock.close()
        raise
