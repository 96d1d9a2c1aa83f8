"""The ``raw`` load client (the default): a hand-rolled RFC 6455 client on an epoll loop.

The load client shares the CPUs with the daemon it measures, so it must cost
little: a fixed handshake request, masked client frames and server frames
parsed by hand. Each execution still uses a fresh connection and waits for the
server's close frame and its TCP close, like the Sans-I/O clients.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import select
import socket
import time
from collections.abc import Iterator
from typing import Any, Final

from .client import IO_TIMEOUT_S, RECEIVE_BYTES
from .stats import LoadTally
from .workload import execute_message, tool_result

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - pure-Python fallback
    from websockets.utils import apply_mask

WS_GUID: Final = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, for Sec-WebSocket-Accept
OP_CONT, OP_TEXT, OP_CLOSE = 0x0, 0x1, 0x8
CONNECTING, HANDSHAKE, OPEN, CLOSING = range(4)
CHECK_INTERVAL_S: Final = 1.0  # how often connections are checked against IO_TIMEOUT_S
POLL_S: Final = 0.5


class _Conn:
    """State of one execution over one fresh connection."""

    __slots__ = ("buf", "fragments", "outcome", "sock", "state", "t0")

    def __init__(self, sock: socket.socket, t0: float) -> None:
        self.sock = sock
        self.t0 = t0
        self.state = CONNECTING
        self.buf = bytearray()
        self.fragments: list[bytes] = []
        self.outcome = "connection ended without done"


def client_frame(opcode: int, payload: bytes) -> bytes:
    """One final client frame, masked with a fresh random key (RFC 6455)."""
    n = len(payload)
    if n < 126:
        header = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        header = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        header = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    mask = os.urandom(4)
    return header + mask + apply_mask(payload, mask)


def read_frames(conn: _Conn) -> Iterator[tuple[int, bytes]]:
    """Whole server frames off ``conn.buf`` (text fragments joined and yielded as one text frame)."""
    buf = conn.buf
    while len(buf) >= 2:
        n = buf[1] & 0x7F
        offset = 2
        if n == 126:
            if len(buf) < 4:
                return
            n, offset = int.from_bytes(buf[2:4], "big"), 4
        elif n == 127:
            if len(buf) < 10:
                return
            n, offset = int.from_bytes(buf[2:10], "big"), 10
        if len(buf) < offset + n:
            return
        b0 = buf[0]
        payload = bytes(buf[offset : offset + n])
        del buf[: offset + n]
        opcode = b0 & 0x0F
        if opcode in (OP_TEXT, OP_CONT):
            conn.fragments.append(payload)
            if b0 & 0x80:
                payload, conn.fragments = b"".join(conn.fragments), []
                yield OP_TEXT, payload
        else:
            yield opcode, payload


class RawLoad:
    """``concurrency`` connections at a time, each replaced when its execution ends, until the window closes."""

    def __init__(self, host: str, port: int, concurrency: int, duration: float, code: str) -> None:
        self.host, self.port, self.concurrency = host, port, concurrency
        key = base64.b64encode(os.urandom(16)).decode()
        self.accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest())
        self.handshake = (
            f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        self.close_frame = client_frame(OP_CLOSE, (1000).to_bytes(2, "big"))
        self.head, self.tail = execute_message("@ID@", code).split(b"@ID@", 1)
        self.pid = os.getpid()
        self.counter = 0
        self.ep = select.epoll()
        self.conns: dict[int, _Conn] = {}
        self.tally = LoadTally(duration)
        self.hard_deadline = self.tally.deadline + IO_TIMEOUT_S

    def run(self) -> dict[str, Any]:
        """The load, then the tally as a JSON-ready result."""
        for _ in range(self.concurrency):
            self.start()
        next_check = time.monotonic() + CHECK_INTERVAL_S
        while self.conns:
            now = time.monotonic()
            if now >= next_check:
                next_check = now + CHECK_INTERVAL_S
                self.expire(now)
            for fd, _ in self.ep.poll(POLL_S):
                conn = self.conns.get(fd)
                if conn is not None:
                    self.on_ready(fd, conn)
        self.ep.close()
        return self.tally.result()

    def start(self) -> None:
        """Open one more connection (non-blocking connect)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock, time.perf_counter())
        sock.connect_ex((self.host, self.port))
        self.conns[sock.fileno()] = conn
        self.ep.register(sock.fileno(), select.EPOLLOUT)

    def finish(self, fd: int, conn: _Conn) -> None:
        """Count ``conn``'s execution, close it and, while the window is open, start the next."""
        self.ep.unregister(fd)
        conn.sock.close()
        del self.conns[fd]
        self.tally.record(conn.outcome, time.perf_counter() - conn.t0)
        if self.tally.in_window():
            self.start()

    def expire(self, now: float) -> None:
        """Fail connections older than ``IO_TIMEOUT_S``, and all of them once past the hard deadline."""
        for fd, conn in list(self.conns.items()):
            if now >= self.hard_deadline or time.perf_counter() - conn.t0 > IO_TIMEOUT_S:
                conn.outcome = "timed out"
                self.finish(fd, conn)

    def on_ready(self, fd: int, conn: _Conn) -> None:
        """Advance ``conn`` on an epoll event: send the handshake once connected, else read and react."""
        sock = conn.sock
        try:
            if conn.state == CONNECTING:
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise OSError(error, os.strerror(error))
                sock.send(self.handshake)
                conn.state = HANDSHAKE
                self.ep.modify(fd, select.EPOLLIN)
                return
            data = sock.recv(RECEIVE_BYTES)
        except BlockingIOError:
            return
        except OSError as exc:
            conn.outcome = f"{type(exc).__name__}: {exc}"
            self.finish(fd, conn)
            return
        if not data:
            if conn.state != CLOSING:
                conn.outcome = conn.outcome or "closed before the closing handshake"
            self.finish(fd, conn)
            return
        conn.buf += data
        if conn.state == HANDSHAKE and not self.open(fd, conn):
            return
        for opcode, payload in read_frames(conn):
            self.on_frame(conn, opcode, payload)

    def open(self, fd: int, conn: _Conn) -> bool:
        """Check the handshake response once whole; on 101, send the ``execute``. False until open."""
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        response = bytes(conn.buf[: end + 4])
        del conn.buf[: end + 4]
        if not response.startswith(b"HTTP/1.1 101") or self.accept not in response:
            conn.outcome = f"handshake failed: {response[:60]!r}"
            self.finish(fd, conn)
            return False
        conn.state = OPEN
        self.counter += 1
        conn.sock.send(client_frame(OP_TEXT, self.head + f"r{self.pid}-{self.counter}".encode() + self.tail))
        return True

    def on_frame(self, conn: _Conn, opcode: int, payload: bytes) -> None:
        """Answer tool calls; close after ``done``; after the server's close, wait for its TCP close."""
        if opcode == OP_TEXT and conn.state == OPEN:
            message = json.loads(payload)
            kind = message.get("type")
            if kind == "done":
                conn.outcome = "" if message.get("ok") is True else f"done not ok: {payload[:200]!r}"
                conn.sock.send(self.close_frame)
            elif kind == "tool_call":
                conn.sock.send(client_frame(OP_TEXT, tool_result(message)))
        elif opcode == OP_CLOSE:
            conn.state = CLOSING


def raw_load(host: str, port: int, concurrency: int, duration: float, code: str) -> dict[str, Any]:
    """Run the raw load client in this process; its result as JSON-ready figures."""
    return RawLoad(host, port, concurrency, duration, code).run()
