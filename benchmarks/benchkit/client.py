"""The latency client: one host connection at a time, websockets' Sans-I/O ``ClientProtocol`` over a blocking socket.

The same client measures the daemon and the echo baseline, so the ratios
between them compare servers, not clients.
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
from websockets.uri import WebSocketURI

from .stats import LatencyStats
from .workload import execute_message, tool_result

IO_TIMEOUT_S: Final = 10.0  # any single socket operation; nothing may hang
RECEIVE_BYTES: Final = 65536


class BlockingClient:
    """A WebSocket client: websockets' ``ClientProtocol`` over a blocking socket."""

    def __init__(self, uri: WebSocketURI) -> None:
        self.ws = ClientProtocol(uri, max_size=None)
        self.sock = socket.create_connection((uri.host, uri.port), timeout=IO_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.eof = False
        self.ws.send_request(self.ws.connect())
        self.flush()
        for event in self.events():
            if isinstance(event, Response):
                if self.ws.state is not State.OPEN:
                    raise ConnectionError(f"handshake failed: HTTP {event.status_code}")
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
        """Protocol events as data arrives, until EOF; bounded by the socket timeout."""
        while not self.eof:
            data = self.sock.recv(RECEIVE_BYTES)
            if data:
                self.ws.receive_data(data)
            else:
                self.ws.receive_eof()
            yield from self.ws.events_received()
            self.flush()
            if not data or self.ws.state is State.CLOSED:
                return

    def send_text(self, data: bytes) -> None:
        self.ws.send_text(data)
        self.flush()

    def texts(self) -> Iterator[bytes]:
        """Whole text messages (fragments joined) until the connection ends.

        Keep one iterator per connection: abandoning it drops messages that
        arrived in the same read.
        """
        fragments: list[bytes] = []
        for event in self.events():
            if isinstance(event, Frame) and event.opcode in (Opcode.TEXT, Opcode.CONT):
                fragments.append(bytes(event.data))
                if event.fin:
                    yield b"".join(fragments)
                    fragments = []

    def close(self) -> None:
        """Closing handshake, then wait for the server to close TCP (bounded), then close."""
        if self.ws.state is State.OPEN:
            self.ws.send_close(1000)
            self.flush()
        for _ in self.events():
            pass
        self.sock.close()


def run_execution(uri: WebSocketURI, exec_id: str, code: str) -> tuple[float, dict[str, Any] | None, str]:
    """One execution on a fresh connection, as a host does it.

    Returns (seconds from connect to closed, the ``done`` message or None, failure detail).
    """
    t0 = time.perf_counter()
    client = BlockingClient(uri)
    client.send_text(execute_message(exec_id, code))
    done: dict[str, Any] | None = None
    detail = ""
    saw_started = False
    for text in client.texts():
        message = json.loads(text)
        kind = message.get("type")
        if kind == "started":
            saw_started = True
        elif kind == "tool_call":
            client.send_text(tool_result(message))
        elif kind == "done":
            done = message
            break
        else:
            detail = f"unexpected message {text[:200]!r}"
    client.close()
    elapsed = time.perf_counter() - t0
    if done is None:
        detail = detail or "connection ended without done"
    elif not saw_started:
        detail = "done without started"
    return elapsed, done, detail


def execute_once(uri: WebSocketURI, stats: LatencyStats, exec_id: str, code: str, expect: Any) -> None:
    """One fresh-connection execution into ``stats``; the done must be ok with result ``expect``."""
    try:
        elapsed, done, detail = run_execution(uri, exec_id, code)
    except (OSError, ValueError) as exc:
        stats.fail(f"{type(exc).__name__}: {exc}")
        return
    if done is None or detail:
        stats.fail(detail)
    elif done.get("ok") is not True:
        stats.fail(f"done not ok: {json.dumps(done)}")
    elif done.get("result") != expect:
        stats.fail(f"unexpected result {done.get('result')!r}, expected {expect!r}")
    else:
        stats.samples_ms.append(elapsed * 1000)


def measure_executions(uri: WebSocketURI, name: str, code: str, iterations: int, expect: Any) -> LatencyStats:
    """Sequential fresh-connection executions of ``code``."""
    stats = LatencyStats(name)
    for i in range(iterations):
        execute_once(uri, stats, f"{name}-{i}", code, expect)
    return stats
