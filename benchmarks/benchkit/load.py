"""The load client: many executions at once, a fresh connection each, on one epoll loop in its own process.

Every script that loads the daemon with concurrent executions runs this one
client (``benchkit.measure`` starts it). It shares the CPUs with the daemon it
measures, so it must cost little: a fixed handshake request, masked frames
built and server frames parsed by hand (RFC 6455), one thread. Each execution:
connect, upgrade, ``execute``, answer every ``tool_call`` (``delay`` seconds
after it came, or at once) with its input, check the ``done``, closing
handshake, wait for the server's TCP close; then the next one starts, until
``n`` have started or the ``duration`` is over, at most ``concurrency`` at
once and at most ``opening`` handshakes under way (real hosts are separate
machines that send their request as soon as they connect; one process opening
thousands at once would leave most connected and silent, which the daemon sheds
as an idle flood). Every wait is bounded by ``wait_s``, the whole run by ``limit_s``.

Run as ``python -m benchkit.load SPEC`` (SPEC: ``Spec`` as JSON): it says
``ready``, waits for ``go`` on stdin (so the caller reads its CPU counters
first), runs, and prints its result as one JSON line.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import json
import math
import os
import resource
import select
import socket
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Final

from websockets.uri import parse_uri

from .workload import tool_result

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - pure-Python fallback
    from websockets.utils import apply_mask

WS_GUID: Final = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455, for Sec-WebSocket-Accept
OP_TEXT, OP_CLOSE = 0x1, 0x8
# A connection's life: TCP connect, HTTP upgrade, open, our close frame sent, both close frames exchanged.
CONNECTING, HANDSHAKE, OPEN, CLOSING, CLOSED = range(5)
STATE_NAMES: Final = ("connecting", "handshake", "open", "closing", "closed")
CHECK_S: Final = 0.5  # how often connections are checked against their deadlines
FAILURE_REASONS: Final = 5
ID: Final = "@ID@"  # where each execution's id goes in ``Spec.execute``


@dataclass(frozen=True)
class Spec:
    """One load: ``execute`` is the message with ``ID`` for the id; ``expect`` the ``done``'s result
    (None: any, as long as it is ok); ``n`` 0 for as many as ``duration`` allows."""

    url: str
    execute: str
    expect: Any = None
    concurrency: int = 64
    duration: float = math.inf
    n: int = 0
    opening: int = 256
    delay: float = 0.0
    wait_s: float = 10.0
    limit_s: float = 600.0


class Conn:
    """One connection: its socket, unread bytes, the text message being put together, and how it went."""

    __slots__ = ("buf", "deadline", "fragments", "key", "outcome", "parked", "sock", "state", "status", "t0")

    def __init__(self, sock: socket.socket, key: int, t0: float, deadline: float) -> None:
        self.sock, self.key, self.t0, self.deadline = sock, key, t0, deadline
        self.state = CONNECTING
        self.status = 0  # of the handshake's response
        self.buf = bytearray()
        self.fragments: list[bytes] = []
        self.parked = False  # a tool_call has come
        self.outcome = "connection ended without done"  # "" once it went well


def frame(opcode: int, payload: bytes) -> bytes:
    """One final client frame, masked with a fresh key."""
    n = len(payload)
    if n < 126:
        header = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        header = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        header = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    mask = os.urandom(4)
    return header + mask + apply_mask(payload, mask)


def server_frames(conn: Conn) -> list[tuple[int, bytes]]:
    """Whole server frames off ``conn.buf`` (text fragments joined into one text frame)."""
    buf, frames = conn.buf, []
    while len(buf) >= 2:
        n, offset = buf[1] & 0x7F, 2
        if n == 126:
            n, offset = int.from_bytes(buf[2:4], "big"), 4
        elif n == 127:
            n, offset = int.from_bytes(buf[2:10], "big"), 10
        if len(buf) < offset + n:
            break
        first, payload = buf[0], bytes(buf[offset : offset + n])
        del buf[: offset + n]
        if (first & 0x0F) in (OP_TEXT, 0):  # text or continuation
            conn.fragments.append(payload)
            if first & 0x80:
                frames.append((OP_TEXT, b"".join(conn.fragments)))
                conn.fragments = []
        else:
            frames.append((first & 0x0F, payload))
    return frames


class Load:
    """The run: connections on one epoll loop, opened, advanced, bounded and counted."""

    def __init__(self, spec: Spec) -> None:
        uri = parse_uri(spec.url)
        self.spec, self.address = spec, (uri.host, uri.port)
        # One key for every connection: the server only echoes it, and a request per connection would cost CPU.
        key = base64.b64encode(os.urandom(16)).decode()
        self.accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest())
        self.handshake = (
            f"GET / HTTP/1.1\r\nHost: {uri.host}:{uri.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        self.close_frame = frame(OP_CLOSE, (1000).to_bytes(2, "big"))
        self.head, self.tail = spec.execute.encode().split(ID.encode(), 1)
        self.ep = select.epoll()
        self.conns: dict[int, Conn] = {}
        self.answers: list[tuple[float, int, Conn, bytes]] = []  # (due, key, conn, tool_result): a heap
        self.started = self.handshaking = 0
        self.ok = self.refused = self.parked = 0
        self.failures: Counter[str] = Counter()
        self.latencies_ms: list[float] = []
        self.last_parked_s = self.last_done_s = 0.0
        self.began = time.monotonic()
        self.window_end = self.began + spec.duration
        self.hard_deadline = self.began + spec.limit_s
        self.cpu0 = time.process_time()

    def run(self) -> dict[str, Any]:
        """Until every execution has ended (or the limit passed); the figures, JSON-ready."""
        self.launch()
        next_check = time.monotonic() + CHECK_S
        try:
            while self.conns or self.more():
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + CHECK_S
                    self.expire(now)
                    self.launch()  # after failed connects: the slots they freed
                timeout = min(next_check - now, self.send_answers(now))
                # Resolved before any is handled: a connection opened meanwhile may reuse the descriptor of one
                # that just ended, and must not get that one's event.
                for fd, conn in [(fd, self.conns.get(fd)) for fd, _ in self.ep.poll(max(0.0, timeout))]:
                    if conn is not None and self.conns.get(fd) is conn:
                        self.ready(fd, conn)
        finally:  # only after an error does anything stay open
            for conn in self.conns.values():
                conn.sock.close()
            self.ep.close()
        if self.spec.n > self.started:
            self.failures["not started within the run's time limit"] += self.spec.n - self.started
        return {
            "ok": self.ok,
            "refused": self.refused,
            "failed": self.failures.total(),
            "failure_reasons": dict(self.failures.most_common(FAILURE_REASONS)),
            "completed": len(self.latencies_ms),  # ok within the window
            "latencies_ms": self.latencies_ms,
            "parked": self.parked,
            "last_parked_s": self.last_parked_s,
            "last_done_s": self.last_done_s,
            "cpu_s": time.process_time() - self.cpu0,
            "elapsed_s": time.monotonic() - self.began,
        }

    def more(self) -> bool:
        """Whether more executions are to start."""
        now = time.monotonic()
        return (self.spec.n == 0 or self.started < self.spec.n) and now < self.window_end and now < self.hard_deadline

    def launch(self) -> None:
        """Open connections up to the concurrency and the handshakes under way allowed."""
        spec = self.spec
        while len(self.conns) < spec.concurrency and self.handshaking < spec.opening and self.more():
            self.started += 1
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            now = time.monotonic()
            conn = Conn(sock, self.started, now, now + spec.wait_s)
            try:
                sock.connect_ex(self.address)
                self.ep.register(sock.fileno(), select.EPOLLOUT)
            except OSError as exc:  # out of descriptors or ports: a failure, not the end of the run
                sock.close()
                self.failures[f"connect: {type(exc).__name__}: {exc}"] += 1
                return
            self.conns[sock.fileno()] = conn
            self.handshaking += 1

    def send(self, conn: Conn, data: bytes) -> None:
        """All of ``data`` or raise: a short write of a small frame means a stuck peer."""
        if conn.sock.send(data) != len(data):
            raise ConnectionError("short write")
        conn.deadline = time.monotonic() + self.spec.wait_s

    def end(self, fd: int, conn: Conn, outcome: str | None = None) -> None:
        """Close and count ``conn`` (failed with ``outcome`` if given); start the next."""
        if outcome is not None:
            conn.outcome = outcome
        self.ep.unregister(fd)
        conn.sock.close()
        del self.conns[fd]
        if conn.state in (CONNECTING, HANDSHAKE):
            self.handshaking -= 1
        if not conn.outcome:
            self.ok += 1
            if time.monotonic() <= self.window_end:
                self.latencies_ms.append((time.monotonic() - conn.t0) * 1000)
        elif conn.status == 503:
            self.refused += 1
        else:
            self.failures[conn.outcome] += 1
        self.launch()

    def expire(self, now: float) -> None:
        """Fail connections past their deadline, and all of them past the run's."""
        for fd, conn in list(self.conns.items()):
            if now >= conn.deadline or now >= self.hard_deadline:
                self.end(fd, conn, f"timed out ({STATE_NAMES[conn.state]})")

    def send_answers(self, now: float) -> float:
        """Send the tool results that are due; how long until the next one is."""
        answers = self.answers
        while answers and answers[0][0] <= now:
            _, _, conn, data = heapq.heappop(answers)
            fd = conn.sock.fileno()
            if self.conns.get(fd) is not conn or conn.state >= CLOSING:
                continue  # ended while parked
            try:
                self.send(conn, data)
            except OSError as exc:
                self.end(fd, conn, f"{type(exc).__name__}: {exc}")
        return answers[0][0] - now if answers else CHECK_S

    def ready(self, fd: int, conn: Conn) -> None:
        """Advance ``conn`` on an epoll event: send the handshake once connected, else read and react."""
        try:
            if conn.state == CONNECTING:
                error = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    raise OSError(error, os.strerror(error))
                self.send(conn, self.handshake)
                conn.state = HANDSHAKE
                self.ep.modify(fd, select.EPOLLIN)
                return
            data = conn.sock.recv(65536)
            if not data:
                if conn.state != CLOSED and not conn.outcome:
                    conn.outcome = "closed before the closing handshake"
                self.end(fd, conn)
                return
            conn.buf += data
            if conn.state == HANDSHAKE and not self.upgrade(fd, conn):
                return
            for opcode, payload in server_frames(conn):
                if opcode == OP_TEXT and conn.state == OPEN:
                    self.message(conn, payload)
                elif opcode == OP_CLOSE:
                    if conn.state == OPEN:
                        self.send(conn, self.close_frame)  # the server closed first: answer it
                    conn.state = CLOSED
        except BlockingIOError:
            return
        except (OSError, ValueError) as exc:  # ValueError: JSON or UTF-8 the server should not have sent
            self.end(fd, conn, f"{type(exc).__name__}: {exc}")

    def upgrade(self, fd: int, conn: Conn) -> bool:
        """Check the handshake's response once whole, then send the ``execute``; False until open."""
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        response = bytes(conn.buf[: end + 4])
        del conn.buf[: end + 4]
        status = response.split(b" ", 2)[1:2]
        conn.status = int(status[0]) if status and status[0].isdigit() else -1
        if conn.status != 101 or self.accept not in response:
            self.end(fd, conn, f"handshake failed: {response[:60]!r}")
            return False
        conn.state = OPEN
        self.handshaking -= 1
        self.send(conn, frame(OP_TEXT, self.head + f"L{os.getpid()}-{conn.key}".encode() + self.tail))
        self.launch()
        return True

    def message(self, conn: Conn, payload: bytes) -> None:
        """Answer a ``tool_call`` (now or after the delay); check a ``done``, then close."""
        message = json.loads(payload)
        kind = message.get("type")
        if kind == "tool_call":
            if not conn.parked:
                conn.parked = True
                self.parked += 1
                self.last_parked_s = time.monotonic() - self.began
            answer = frame(OP_TEXT, tool_result(message))
            if self.spec.delay > 0:
                due = time.monotonic() + self.spec.delay
                heapq.heappush(self.answers, (due, conn.key, conn, answer))
                conn.deadline = due + self.spec.wait_s
            else:
                self.send(conn, answer)
        elif kind == "done":
            self.last_done_s = time.monotonic() - self.began
            expect = self.spec.expect
            if message.get("ok") is not True or (expect is not None and message.get("result") != expect):
                conn.outcome = f"done not as expected: {payload[:200]!r}"
            else:
                conn.outcome = ""
            self.send(conn, self.close_frame)
            conn.state = CLOSING


def raise_nofile_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: 10,000 connections need 10,000 descriptors."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(spec: Spec) -> None:
    """Say ``ready``, wait for ``go`` on stdin, run, print the figures as one JSON line."""
    raise_nofile_limit()
    print("ready", flush=True)
    if sys.stdin.readline().strip() == "go":
        print(json.dumps(Load(spec).run()), flush=True)


def argument(spec: Spec) -> str:
    """``spec`` as the command line's argument."""
    return json.dumps(asdict(spec))


if __name__ == "__main__":
    main(Spec(**json.loads(sys.argv[1])))
