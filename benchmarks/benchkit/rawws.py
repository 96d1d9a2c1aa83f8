"""A hand-rolled RFC 6455 client on an epoll loop, the base of the ``raw`` load and parked clients.

The client shares the CPUs with the daemon it measures, so it must cost
little: a fixed handshake request, masked client frames and server frames
parsed by hand, many connections on one epoll loop in one thread. Subclasses
say what to do once a connection is open, on each text message, and when a
connection ends; this module does the sockets, the frames, the closing
handshake and the time bounds.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import select
import socket
import time
from collections.abc import Iterator
from typing import Any, Final

from .client import RECEIVE_BYTES

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - pure-Python fallback
    from websockets.utils import apply_mask

WS_GUID: Final = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, for Sec-WebSocket-Accept
OP_CONT, OP_TEXT, OP_CLOSE = 0x0, 0x1, 0x8
# A connection's life: TCP connect, HTTP upgrade, open, our close frame sent, both close frames exchanged.
CONNECTING, HANDSHAKE, OPEN, CLOSING, CLOSED = range(5)
STATE_NAMES: Final = ("connecting", "handshake", "open", "closing", "closed")
CHECK_INTERVAL_S: Final = 1.0  # how often connections are checked against their deadlines
POLL_S: Final = 0.5


class RawConn:
    """One connection: its socket, unread bytes, the text message being reassembled, and how it ended.

    ``key`` numbers the connection for its owner; ``status`` is the HTTP status
    of the handshake response (0 before it arrives); ``outcome`` is empty on
    success, else what went wrong; ``deadline`` (``time.monotonic``) is when
    the current wait fails.
    """

    __slots__ = ("buf", "deadline", "fragments", "key", "outcome", "sock", "state", "status", "t0")

    def __init__(self, sock: socket.socket, key: int, t0: float, deadline: float) -> None:
        self.sock = sock
        self.key = key
        self.t0 = t0
        self.deadline = deadline
        self.state = CONNECTING
        self.status = 0
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


def read_frames(conn: RawConn) -> Iterator[tuple[int, bytes]]:
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


def handshake_request(host: str, port: int) -> tuple[bytes, bytes]:
    """(the fixed upgrade request, the ``Sec-WebSocket-Accept`` value a 101 must carry).

    One key for every connection: the server only echoes it, and building a
    request per connection would cost the client CPU the benchmark measures.
    """
    key = base64.b64encode(os.urandom(16)).decode()
    accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest())
    request = (
        f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    return request, accept


class RawClient:
    """Connections to ``host:port`` on one epoll loop; ``run`` returns once ``busy`` is false.

    Every wait is bounded: a connection fails when its ``deadline`` passes,
    and all of them once ``hard_deadline`` does.
    """

    def __init__(self, host: str, port: int, hard_deadline: float = math.inf) -> None:
        self.host, self.port = host, port
        self.hard_deadline = hard_deadline
        self.handshake, self.accept = handshake_request(host, port)
        self.close_frame = client_frame(OP_CLOSE, (1000).to_bytes(2, "big"))
        self.ep = select.epoll()
        self.conns: dict[int, RawConn] = {}

    # What subclasses say.

    def on_open(self, conn: RawConn) -> None:
        """The 101 has arrived: send the first message."""
        raise NotImplementedError

    def on_message(self, conn: RawConn, message: dict[str, Any], payload: bytes) -> None:
        """A whole text message from the server, decoded (``payload`` is its raw JSON)."""
        raise NotImplementedError

    def on_end(self, conn: RawConn) -> None:
        """``conn`` is closed and gone; ``conn.outcome`` says how it went."""

    def busy(self) -> bool:
        """Whether there is more to do (by default: while connections are open)."""
        return bool(self.conns)

    def tick(self, now: float) -> float:
        """Called every loop turn: do what is due; how long the next poll may wait at most."""
        return POLL_S

    # The machinery.

    def run(self) -> None:
        """The loop: deadlines, the subclass's timed work, socket events; until not ``busy``."""
        next_check = time.monotonic() + CHECK_INTERVAL_S
        try:
            while self.busy():
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + CHECK_INTERVAL_S
                    self.expire(now)
                timeout = min(self.tick(now), max(0.0, next_check - now))
                # Resolved before any is handled: a connection opened while handling one event may reuse
                # the descriptor of one that just ended, and must not receive that one's later event.
                ready = [(fd, self.conns.get(fd)) for fd, _ in self.ep.poll(timeout)]
                for fd, conn in ready:
                    if conn is not None and self.conns.get(fd) is conn:
                        self.on_ready(fd, conn)
        finally:  # only after an error: a normal end leaves nothing open
            for conn in self.conns.values():
                conn.sock.close()
            self.ep.close()

    def connect(self, key: int, wait_s: float) -> RawConn:
        """Open one more connection (non-blocking connect); its handshake must be answered within ``wait_s``."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        now = time.monotonic()
        conn = RawConn(sock, key, now, now + wait_s)
        sock.connect_ex((self.host, self.port))
        self.conns[sock.fileno()] = conn
        self.ep.register(sock.fileno(), select.EPOLLOUT)
        return conn

    def send(self, conn: RawConn, data: bytes) -> None:
        """Write ``data`` whole or raise: a short write of a small frame means a stuck peer, a failure here."""
        if conn.sock.send(data) != len(data):
            raise ConnectionError("short write")

    def close(self, conn: RawConn) -> None:
        """Start the closing handshake: our close frame; the server's close frame and TCP close follow."""
        self.send(conn, self.close_frame)
        conn.state = CLOSING

    def end(self, fd: int, conn: RawConn) -> None:
        """Close ``conn``'s socket, forget it, and tell the subclass."""
        self.ep.unregister(fd)
        conn.sock.close()
        del self.conns[fd]
        self.on_end(conn)

    def fail(self, fd: int, conn: RawConn, outcome: str) -> None:
        """End ``conn`` as failed with ``outcome``."""
        conn.outcome = outcome
        self.end(fd, conn)

    def expire(self, now: float) -> None:
        """Fail connections past their deadline, and all of them once past the hard deadline."""
        for fd, conn in list(self.conns.items()):
            if now >= conn.deadline or now >= self.hard_deadline:
                self.fail(fd, conn, f"timed out ({STATE_NAMES[conn.state]})")

    def on_ready(self, fd: int, conn: RawConn) -> None:
        """Advance ``conn`` on an epoll event: send the handshake once connected, else read and react."""
        sock = conn.sock
        try:
            if conn.state == CONNECTING:
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise OSError(error, os.strerror(error))
                self.send(conn, self.handshake)
                conn.state = HANDSHAKE
                self.ep.modify(fd, select.EPOLLIN)
                return
            data = sock.recv(RECEIVE_BYTES)
            if not data:
                if conn.state != CLOSED:
                    conn.outcome = conn.outcome or "closed before the closing handshake"
                self.end(fd, conn)
                return
            conn.buf += data
            if conn.state == HANDSHAKE and not self.upgrade(fd, conn):
                return
            for opcode, payload in read_frames(conn):
                if opcode == OP_TEXT and conn.state == OPEN:
                    self.on_message(conn, json.loads(payload), payload)
                elif opcode == OP_CLOSE:
                    if conn.state == OPEN:
                        self.send(conn, self.close_frame)  # the server closed first: answer it
                    conn.state = CLOSED
        except BlockingIOError:
            return
        except (OSError, ValueError) as exc:  # ValueError: JSON or UTF-8 the server should not have sent
            self.fail(fd, conn, f"{type(exc).__name__}: {exc}")

    def upgrade(self, fd: int, conn: RawConn) -> bool:
        """Check the handshake response once whole; on a 101, ``on_open``. False until open."""
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        response = bytes(conn.buf[: end + 4])
        del conn.buf[: end + 4]
        status = response.split(b" ", 2)[1:2]
        conn.status = int(status[0]) if status and status[0].isdigit() else -1
        if conn.status != 101 or self.accept not in response:
            self.fail(fd, conn, f"handshake failed: {response[:60]!r}")
            return False
        conn.state = OPEN
        self.on_open(conn)
        return True
