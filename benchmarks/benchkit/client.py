"""The latency client: one host connection, websockets' Sans-I/O ``ClientProtocol`` over a blocking socket.

Every script that times single executions (``latency.py``, ``neighbours.py``)
uses it; many executions at once go through the load client (``benchkit.load``).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any, Final

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.uri import parse_uri

from .workload import execute_message, tool_result

IO_TIMEOUT_S: Final = 10.0  # any single socket operation; nothing may hang


class BlockingClient:
    """A WebSocket connection to ``url``, open once built; every socket operation is bounded."""

    def __init__(self, url: str, token: str | None = None) -> None:
        """``token``: sent as ``Authorization: Bearer TOKEN`` (a daemon with tokens requires one)."""
        uri = parse_uri(url)
        self.ws = ClientProtocol(uri, max_size=None)
        self.sock = socket.create_connection((uri.host, uri.port), timeout=IO_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.eof = False
        request = self.ws.connect()
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token}"
        self.ws.send_request(request)
        self.flush()
        for event in self.events():
            if isinstance(event, Response):
                if self.ws.state is not State.OPEN:
                    raise ConnectionError(f"handshake failed: HTTP {event.status_code}")
                self.incoming = self.messages()  # one iterator: a read may hold several messages
                return
        raise ConnectionError("connection closed during the handshake")

    def flush(self) -> None:
        """Write what the protocol has queued."""
        for data in self.ws.data_to_send():
            if data:
                self.sock.sendall(data)
            else:
                self.eof = True  # the protocol wants the TCP connection closed

    def events(self) -> Iterator[Request | Response | Frame]:
        """Protocol events as data arrives, until EOF."""
        while not self.eof:
            data = self.sock.recv(65536)
            if data:
                self.ws.receive_data(data)
            else:
                self.ws.receive_eof()
            yield from self.ws.events_received()
            self.flush()
            if not data or self.ws.state is State.CLOSED:
                return

    def messages(self) -> Iterator[dict[str, Any]]:
        """Whole text messages (fragments joined), decoded, until the connection ends."""
        fragments: list[bytes] = []
        for event in self.events():
            if isinstance(event, Frame) and event.opcode in (Opcode.TEXT, Opcode.CONT):
                fragments.append(bytes(event.data))
                if event.fin:
                    yield json.loads(b"".join(fragments))
                    fragments = []

    def receive(self) -> dict[str, Any]:
        """The next message; ``StopIteration`` if the connection ended."""
        return next(self.incoming)

    def send(self, data: bytes) -> None:
        self.ws.send_text(data)
        self.flush()

    def close(self) -> None:
        """Closing handshake, then wait for the server to close TCP (bounded), then close."""
        if self.ws.state is State.OPEN:
            self.ws.send_close(1000)
            self.flush()
        for _ in self.events():
            pass
        self.sock.close()


def run_execution(
    url: str, exec_id: str, code: str, token: str | None = None
) -> tuple[float, dict[str, Any] | None, str]:
    """One execution on a fresh connection, as a host does it, every ``tool_call`` answered at once
    with its input. Returns (seconds from connect to closed, the ``done`` or None, what went wrong)."""
    t0 = time.perf_counter()
    client = BlockingClient(url, token)
    client.send(execute_message(exec_id, code))
    done: dict[str, Any] | None = None
    detail = ""
    saw_started = False
    for message in client.incoming:
        kind = message.get("type")
        if kind == "started":
            saw_started = True
        elif kind == "tool_call":
            client.send(tool_result(message))
        elif kind == "done":
            done = message
            break
        else:
            detail = f"unexpected message {str(message)[:200]}"
    client.close()
    elapsed = time.perf_counter() - t0
    if done is None:
        detail = detail or "connection ended without done"
    elif not saw_started:
        detail = "done without started"
    return elapsed, done, detail
