"""One client WebSocket connection: websockets' Sans-I/O protocol over an anyio stream.

The daemon drives the same Sans-I/O protocol over trio; here anyio carries it,
so one code base serves asyncio and trio hosts alike. The connection knows
frames and the handshake, nothing of execbox messages. Every wait is bounded
or cancellable, and every failure surfaces as one of the client's errors.
"""

from __future__ import annotations

import socket
import ssl
from collections import deque
from typing import Final
from urllib.parse import urlsplit

import anyio
import anyio.abc
from websockets.client import ClientProtocol
from websockets.exceptions import InvalidStatus, InvalidURI
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import WebSocketURI, parse_uri

from ..exposure import UNSENDABLE, sendable
from .errors import (
    QuotaExceeded,
    RunnerBusy,
    RunnerDisconnected,
    RunnerProtocolError,
    RunnerRefused,
    RunnerUnavailable,
    Unauthorized,
)

RECEIVE_BYTES: Final = 65536
SEND_TIMEOUT_S: Final = 10.0  # a runner that reads nothing for this long is gone
CLOSE_TIMEOUT_S: Final = 1.0  # how long the closing handshake may take before the socket is just closed
_STREAM_ERRORS: Final = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
# OpenSSL's reasons for a handshake that met something other than TLS (a plain HTTP server, or
# one that closed the connection on the TLS hello).
_NOT_TLS: Final = frozenset(
    {
        "WRONG_VERSION_NUMBER",
        "UNEXPECTED_EOF_WHILE_READING",
        "RECORD_LAYER_FAILURE",
        "PACKET_LENGTH_TOO_LONG",
        "HTTP_REQUEST",
    }
)


class WebSocket:
    """A connected WebSocket client; one task receives, any task may send."""

    def __init__(self, stream: anyio.abc.ByteStream, protocol: ClientProtocol) -> None:
        self._stream = stream
        self._protocol = protocol
        self._frames: deque[Frame] = deque()  # received (some with the handshake response), not yet handed out
        self._fragments: list[bytes] = []
        self._send_lock = anyio.Lock()

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = 10.0,
        max_size: int | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> WebSocket:
        """Connect and complete the handshake (with ``headers`` added to the request), or raise why
        not (refusals carry the HTTP status)."""
        uri = checked_url(url)
        check_token(token)
        protocol = ClientProtocol(uri, max_size=max_size)
        request = protocol.connect()
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token}"
        request.headers.update(headers)
        protocol.send_request(request)
        stream: anyio.abc.ByteStream | None = None
        try:
            with anyio.fail_after(connect_timeout):
                if uri.secure:
                    stream = await anyio.connect_tcp(
                        uri.host, uri.port, ssl_context=ssl_context or ssl.create_default_context(), tls=True
                    )
                else:
                    stream = await anyio.connect_tcp(uri.host, uri.port)
                websocket = cls(stream, protocol)
                await websocket._flush()
                response = await websocket._handshake_response()
        except TimeoutError:
            await _close_quietly(stream)
            raise RunnerUnavailable(f"no WebSocket handshake with {url} within {connect_timeout:g} s") from None
        except _STREAM_ERRORS as exc:  # refused, reset, TLS failures (ssl.SSLError is an OSError)
            await _close_quietly(stream)
            raise RunnerUnavailable(f"cannot connect to {url}: {_reason(exc, uri)}") from exc
        except BaseException:
            await _close_quietly(stream)
            raise
        if protocol.handshake_exc is not None:
            await _close_quietly(stream)
            raise _refusal(url, response, protocol.handshake_exc)
        return websocket

    async def _handshake_response(self) -> Response | None:
        response = None
        while True:
            for event in self._protocol.events_received():
                if isinstance(event, Response):
                    response = event
                elif isinstance(event, Frame):
                    self._frames.append(event)
            if response is not None or self._protocol.handshake_exc is not None:
                return response
            data = await self._stream.receive(RECEIVE_BYTES)
            self._protocol.receive_data(data)

    async def send_text(self, data: bytes) -> None:
        """Send one text message; raises ``RunnerDisconnected`` when the connection is gone."""
        if self._protocol.state is not State.OPEN:
            raise RunnerDisconnected("the connection to the runner is closed", self._protocol.close_code)
        self._protocol.send_text(data)
        await self._flush()

    async def receive(self) -> bytes:
        """The next text message; ``RunnerDisconnected`` once the runner closes or the socket ends."""
        while True:
            while self._frames:
                message = self._message(self._frames.popleft())
                if message is not None:
                    return message
            try:
                data = await self._stream.receive(RECEIVE_BYTES)
            except _STREAM_ERRORS:
                self._protocol.receive_eof()
                raise RunnerDisconnected("the runner closed the connection without a close frame", 1006) from None
            self._protocol.receive_data(data)
            self._frames.extend(event for event in self._protocol.events_received() if isinstance(event, Frame))
            await self._flush()  # pongs, and the answer to a close frame

    def _message(self, frame: Frame) -> bytes | None:
        if frame.opcode is Opcode.CLOSE:  # from the frame: websockets' ``close_code`` is None until the TCP close
            close = Close.parse(frame.data)
            raise RunnerDisconnected(
                f"the runner closed the connection ({close.code}: {close.reason})", close.code, close.reason
            )
        if frame.opcode is Opcode.BINARY or (frame.opcode is Opcode.CONT and not self._fragments):
            raise RunnerProtocolError("the runner sent a binary frame; runner messages are JSON text")
        if frame.opcode in (Opcode.TEXT, Opcode.CONT):
            self._fragments.append(bytes(frame.data))
            if frame.fin:
                data, self._fragments = b"".join(self._fragments), []
                return data
        return None  # a ping or a pong, or part of a message

    async def close(self) -> None:
        """Close the WebSocket properly (bounded in time), then the socket."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(CLOSE_TIMEOUT_S):
                try:
                    if self._protocol.state is State.OPEN:
                        self._protocol.send_close(1000)
                        await self._flush()
                    while self._protocol.state is not State.CLOSED:  # until the runner closes the socket
                        self._protocol.receive_data(await self._stream.receive(RECEIVE_BYTES))
                except (*_STREAM_ERRORS, RunnerDisconnected):
                    pass
            await self.abort()

    async def abort(self) -> None:
        """Drop the connection at once, as a host does when a runner ignores ``cancel``."""
        await _close_quietly(self._stream)

    async def _flush(self) -> None:
        """Write what the protocol has queued: shielded, so a cancelled task never leaves half a
        frame on the wire, and bounded, so a runner that stops reading cannot hold the caller."""
        async with self._send_lock:
            with anyio.CancelScope(shield=True), anyio.move_on_after(SEND_TIMEOUT_S) as scope:
                for data in self._protocol.data_to_send():
                    try:
                        if data:
                            await self._stream.send(data)
                        elif isinstance(self._stream, anyio.abc.SocketStream):
                            await self._stream.send_eof()
                    except _STREAM_ERRORS:
                        return  # the receiving side reports the closed connection
        if scope.cancelled_caught:
            await self.abort()
            raise RunnerDisconnected(f"the runner read nothing for {SEND_TIMEOUT_S:g} s")


def checked_url(url: str) -> WebSocketURI:
    """``url`` parsed; ``ValueError`` saying why when it is not a ``ws://`` or ``wss://`` URL of a runner."""
    try:
        if any(char.isspace() or not char.isprintable() for char in url):
            raise ValueError("it holds spaces or control characters")
        if urlsplit(url).port == 0:
            raise ValueError("port 0 cannot be connected to")
        return parse_uri(url)
    except InvalidURI as exc:
        raise ValueError(f"not a ws:// or wss:// URL: {url!r} ({str(exc).rpartition(': ')[2]})") from None
    except ValueError as exc:  # urllib's too: a port out of range or not a number, an unclosed IPv6 bracket
        raise ValueError(f"not a ws:// or wss:// URL: {url!r} ({str(exc).lower()})") from None


def check_token(token: str | None) -> None:
    """``ValueError`` for a bearer token that cannot be sent as one: empty, or not printable ASCII
    without spaces (a newline, for one, would end the header). The message never shows the token."""
    if token is not None and not sendable(token):
        raise ValueError(UNSENDABLE)


def _reason(exc: BaseException, uri: WebSocketURI) -> str:
    """Why a connection failed, in words: anyio wraps the cause of a failed connection or TLS
    handshake in exceptions that say nothing themselves."""
    cause = exc
    while cause.__cause__ is not None and (isinstance(cause, anyio.BrokenResourceError) or type(cause) is OSError):
        cause = cause.__cause__  # the error of the last address tried, or of the TLS layer
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {cause.verify_message} (is its CA trusted here?)"
    if isinstance(cause, ssl.SSLError):
        what = (cause.reason or "").replace("_", " ").lower() or cause.strerror or str(cause)
        plain = isinstance(cause, ssl.SSLEOFError) or cause.reason in _NOT_TLS
        return f"TLS handshake failed: {what}{' (is the runner serving plain ws://?)' if plain else ''}"
    if isinstance(cause, ConnectionRefusedError):
        return f"connection refused (nothing listens on {uri.host}:{uri.port})"
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve the host name {uri.host!r}: {cause.strerror}"
    if isinstance(cause, anyio.EndOfStream | anyio.BrokenResourceError | ConnectionResetError):
        hint = "" if uri.secure else " (is the runner serving wss://?)"
        return f"the runner closed the connection during the handshake{hint}"
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(cause) or type(cause).__name__


def _refusal(url: str, response: Response | None, exc: Exception) -> Exception:
    if response is None or not isinstance(exc, InvalidStatus):
        return RunnerUnavailable(f"{url} did not complete a WebSocket handshake: {exc}")
    status = response.status_code
    body = bytes(response.body).decode("utf-8", "replace")[:500]
    retry_after = response.headers.get("Retry-After")
    try:
        delay = float(retry_after) if retry_after is not None else None
    except ValueError:
        delay = None
    kind = {401: Unauthorized, 429: QuotaExceeded, 503: RunnerBusy}.get(status, RunnerRefused)
    return kind(url, status, body, delay)


async def _close_quietly(stream: anyio.abc.ByteStream | None) -> None:
    if stream is not None:
        await anyio.aclose_forcefully(stream)
