#!/usr/bin/env python3
"""Loopback benchmark of the execbox runner daemon.

Measures, against a daemon this script starts (or ``--url`` of a running one):

1. latency (median, p95) of a full execution over a fresh WebSocket
   connection (connect, execute, answer tool calls, done, close) with 0, 1
   and 10 sequential tool calls;
2. the marginal cost of one tool call;
3. baselines from a bare WebSocket echo server started in a subprocess
   (websockets' Sans-I/O ``ServerProtocol`` over trio, the daemon's own
   style): connect + one echo + close, and one echo round trip on an open
   connection; and the target ratios against them;
4. throughput (executions/s, fresh connection each) at several concurrencies,
   with the CPU used by the load clients vs. the daemon and its workers;
5. the median latency of a CPU-bound guest.

Clients are deliberately cheap: websockets' Sans-I/O ``ClientProtocol``
over a blocking socket for latencies; for throughput, separate processes
running either a hand-rolled RFC 6455 client on an epoll loop (``raw``, the
default: the client shares the CPUs with the daemon, so it must cost little)
or ``ClientProtocol`` over ``asyncio.Protocol`` callbacks (``sansio``).
CPU use of the daemon, its workers and the load clients comes from /proc.

Run ``python benchmarks/bench.py --help``; ``--json`` prints a JSON summary
on stdout (the human-readable report then goes to stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import math
import os
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TextIO

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.uri import WebSocketURI, parse_uri

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - pure-Python fallback
    from websockets.utils import apply_mask

OPTIONS: Final[dict[str, int]] = {
    "timeoutMs": 5000,
    "memoryLimitBytes": 67108864,
    "maxLogLines": 100,
    "maxLogChars": 64000,
}
PROVIDERS: Final[list[dict[str, Any]]] = [
    {"name": "tools", "tools": {"echo": {"safeName": "echo", "originalName": "echo"}}, "types": ""}
]
CPU_CODE: Final = "let s = 0; for (let i = 1; i <= 2e6; i++) s += i; s"
CPU_RESULT: Final = 2000001000000
THROUGHPUT_CODE: Final = "1+1"
IO_TIMEOUT_S: Final = 10.0  # any single socket operation; nothing may hang
RECEIVE_BYTES: Final = 65536
TARGET_EXEC_VS_BARE: Final = 1.6
TARGET_TOOL_VS_ECHO: Final = 3.0
TARGET_THROUGHPUT: Final = 1500.0
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")


def tool_code(n: int) -> str:
    """Guest code making ``n`` sequential ``tools.echo`` calls; returns the sum of echoed ``i``."""
    return f"let n = 0; for (let i = 0; i < {n}; i++) {{ const r = await tools.echo({{ i }}); n += r.i; }} n"


def execute_message(exec_id: str, code: str) -> bytes:
    """The spec's ``execute`` message as JSON text."""
    message = {"type": "execute", "id": exec_id, "code": code, "options": OPTIONS, "providers": PROVIDERS}
    return json.dumps(message, separators=(",", ":")).encode()


def tool_result(call: dict[str, Any]) -> bytes:
    """The host's immediate ``ok: true`` answer to a ``tool_call``: result = input."""
    reply: dict[str, Any] = {"type": "tool_result", "callId": call["callId"], "ok": True}
    if "input" in call:
        reply["result"] = call["input"]
    return json.dumps(reply, separators=(",", ":")).encode()


# ---------------------------------------------------------------- statistics


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) with linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def number(value: float, digits: int = 4) -> float | None:
    """``value`` rounded for JSON, None for NaN."""
    return None if math.isnan(value) else round(value, digits)


@dataclass
class LatencyStats:
    """Latencies of one measurement, in milliseconds."""

    name: str
    samples_ms: list[float] = field(default_factory=list)
    failures: int = 0
    failure_examples: list[str] = field(default_factory=list)

    def fail(self, detail: str) -> None:
        self.failures += 1
        if len(self.failure_examples) < 3:
            self.failure_examples.append(detail[:300])

    @property
    def median(self) -> float:
        return percentile(self.samples_ms, 0.5)

    @property
    def p95(self) -> float:
        return percentile(self.samples_ms, 0.95)

    def summary(self) -> dict[str, Any]:
        """JSON-ready figures (None where there were no samples)."""
        return {
            "n": len(self.samples_ms),
            "median_ms": number(self.median),
            "p95_ms": number(self.p95),
            "mean_ms": number(statistics.fmean(self.samples_ms)) if self.samples_ms else None,
            "failures": self.failures,
            "failure_examples": self.failure_examples,
        }


# ---------------------------------------------------------------- blocking Sans-I/O client


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
        """Whole text messages (fragments joined) until the connection ends."""
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


def bare_connect_echo_close_once(uri: WebSocketURI, stats: LatencyStats, payload: bytes) -> None:
    """Baseline (a): connect, one echo of ``payload``, closing handshake, TCP close."""
    try:
        t0 = time.perf_counter()
        client = BlockingClient(uri)
        client.send_text(payload)
        echoed = next(client.texts(), None)
        client.close()
        elapsed = time.perf_counter() - t0
    except (OSError, ValueError) as exc:
        stats.fail(f"{type(exc).__name__}: {exc}")
        return
    if echoed != payload:
        stats.fail("echo mismatch")
    else:
        stats.samples_ms.append(elapsed * 1000)


def bare_echo_once(client: BlockingClient, texts: Iterator[bytes], stats: LatencyStats, payload: bytes) -> None:
    """Baseline (b): one echo round trip of ``payload`` on an open connection."""
    t0 = time.perf_counter()
    client.send_text(payload)
    echoed = next(texts, None)
    elapsed = time.perf_counter() - t0
    if echoed != payload:
        stats.fail("echo mismatch")
    else:
        stats.samples_ms.append(elapsed * 1000)


# ---------------------------------------------------------------- echo server (subprocess)


def echo_server_main() -> None:
    """A bare WebSocket echo server: Sans-I/O ``ServerProtocol`` over trio, like the daemon."""
    import trio
    from websockets.server import ServerProtocol

    async def handle(stream: trio.SocketStream) -> None:
        ws = ServerProtocol(max_size=16 * 1024 * 1024)
        eof = False

        async def flush() -> None:
            nonlocal eof
            for data in ws.data_to_send():
                if data:
                    await stream.send_all(data)
                else:
                    eof = True

        try:
            while not eof:
                data = await stream.receive_some(RECEIVE_BYTES)
                if data:
                    ws.receive_data(data)
                else:
                    ws.receive_eof()
                for event in ws.events_received():
                    if isinstance(event, Request):
                        ws.send_response(ws.accept(event))
                    elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                        ws.send_text(event.data)
                await flush()
                if not data or ws.state is State.CLOSED:
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await stream.aclose()

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        for listener in listeners:
            listener.socket.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        port = listeners[0].socket.getsockname()[1]
        print(f"echo listening on ws://127.0.0.1:{port}/", flush=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, handle, listeners)
            # Exit when the parent closes our stdin (or dies).
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    trio.run(main)


# ---------------------------------------------------------------- load client (subprocess)


class _AsyncExecution(asyncio.Protocol):
    """One execution over one fresh connection, driven by asyncio callbacks."""

    def __init__(self, uri: WebSocketURI, execute: bytes, finished: asyncio.Future[str]) -> None:
        self.ws = ClientProtocol(uri, max_size=None)
        self.execute = execute
        self.finished = finished
        self.transport: asyncio.Transport | None = None
        self.outcome = "connection ended without done"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.ws.send_request(self.ws.connect())
        self._flush()

    def data_received(self, data: bytes) -> None:
        self.ws.receive_data(data)
        self._events()

    def eof_received(self) -> bool:
        self.ws.receive_eof()
        self._events()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_result(self.outcome)

    def _events(self) -> None:
        for event in self.ws.events_received():
            if isinstance(event, Response):
                if self.ws.state is State.OPEN:
                    self.ws.send_text(self.execute)
                else:
                    self.outcome = f"handshake failed: HTTP {event.status_code}"
            elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                message = json.loads(bytes(event.data))
                kind = message.get("type")
                if kind == "done":
                    self.outcome = "" if message.get("ok") is True else f"done not ok: {event.data[:200]!r}"
                    self.ws.send_close(1000)
                elif kind == "tool_call":
                    self.ws.send_text(tool_result(message))
        self._flush()

    def _flush(self) -> None:
        assert self.transport is not None
        for data in self.ws.data_to_send():
            if data:
                self.transport.write(data)
            else:
                self.transport.close()


async def _load(uri: WebSocketURI, concurrency: int, duration: float, code: str) -> dict[str, Any]:
    """Run ``concurrency`` sequential execution loops for ``duration`` seconds."""
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    failures: list[str] = []
    fail_count = 0
    succeeded = 0
    counter = 0
    deadline = loop.time() + duration
    execute_prefix = execute_message("ID", code)

    async def one() -> None:
        nonlocal fail_count, counter, succeeded
        while loop.time() < deadline:
            counter += 1
            payload = execute_prefix.replace(b'"id":"ID"', f'"id":"t{os.getpid()}-{counter}"'.encode(), 1)
            t0 = time.perf_counter()
            finished: asyncio.Future[str] = loop.create_future()
            try:
                async with asyncio.timeout(IO_TIMEOUT_S):
                    await loop.create_connection(lambda: _AsyncExecution(uri, payload, finished), uri.host, uri.port)
                    outcome = await finished
            except (OSError, TimeoutError) as exc:
                outcome = f"{type(exc).__name__}: {exc}"
            elapsed = time.perf_counter() - t0
            if outcome:
                fail_count += 1
                if len(failures) < 3:
                    failures.append(outcome)
                await asyncio.sleep(0.01)  # do not spin on a refusing server
            else:
                succeeded += 1
                if loop.time() <= deadline:
                    latencies.append(elapsed * 1000)

    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(concurrency)))
    return _load_result(latencies, succeeded, fail_count, failures, cpu0, wall0)


def _load_result(
    latencies: list[float], succeeded: int, fail_count: int, failures: list[str], cpu0: float, wall0: float
) -> dict[str, Any]:
    """What a load client reports back to the parent process."""
    return {
        "completed": len(latencies),
        "succeeded_total": succeeded,
        "failures": fail_count,
        "failure_examples": failures,
        "latencies_ms": latencies,
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - wall0,
    }


class _RawConn:
    """State of one execution over one fresh connection in the raw load client."""

    __slots__ = ("buf", "fragments", "outcome", "sock", "state", "t0")

    CONNECTING, HANDSHAKE, OPEN, CLOSING = range(4)

    def __init__(self, sock: socket.socket, t0: float) -> None:
        self.sock = sock
        self.t0 = t0
        self.state = _RawConn.CONNECTING
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


def _raw_load(host: str, port: int, concurrency: int, duration: float, code: str) -> dict[str, Any]:
    """Cheapest possible load: a hand-rolled RFC 6455 client on an epoll loop.

    Fresh connection per execution; handshake with a fixed request, masked
    client frames, server frames parsed by hand; waits for the server's close
    frame and its TCP close, like the Sans-I/O clients.
    """
    key = base64.b64encode(os.urandom(16)).decode()
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
    handshake = (
        f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    close_frame = client_frame(0x8, (1000).to_bytes(2, "big"))
    head, tail = execute_message("@ID@", code).split(b"@ID@", 1)
    pid = os.getpid()
    ep = select.epoll()
    conns: dict[int, _RawConn] = {}
    latencies: list[float] = []
    failures: list[str] = []
    fail_count = 0
    succeeded = 0
    counter = 0
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    deadline = time.monotonic() + duration
    hard_deadline = deadline + IO_TIMEOUT_S

    def start() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _RawConn(sock, time.perf_counter())
        sock.connect_ex((host, port))
        conns[sock.fileno()] = conn
        ep.register(sock.fileno(), select.EPOLLOUT)

    def finish(fd: int, conn: _RawConn) -> None:
        nonlocal fail_count, succeeded
        ep.unregister(fd)
        conn.sock.close()
        del conns[fd]
        if conn.outcome:
            fail_count += 1
            if len(failures) < 3:
                failures.append(conn.outcome)
        else:
            succeeded += 1
            if time.monotonic() <= deadline:
                latencies.append((time.perf_counter() - conn.t0) * 1000)
        if time.monotonic() < deadline:
            start()

    def frames(conn: _RawConn) -> Iterator[tuple[int, bytes]]:
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
            if opcode in (0x1, 0x0):
                conn.fragments.append(payload)
                if b0 & 0x80:
                    payload, conn.fragments = b"".join(conn.fragments), []
                    yield 0x1, payload
            else:
                yield opcode, payload

    for _ in range(concurrency):
        start()
    next_check = time.monotonic() + 1.0
    while conns:
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 1.0
            for fd, conn in list(conns.items()):
                if now >= hard_deadline or time.perf_counter() - conn.t0 > IO_TIMEOUT_S:
                    conn.outcome = "timed out"
                    finish(fd, conn)
        for fd, _ in ep.poll(0.5):
            found = conns.get(fd)
            if found is None:
                continue
            conn, sock = found, found.sock
            try:
                if conn.state == _RawConn.CONNECTING:
                    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if error:
                        raise OSError(error, os.strerror(error))
                    sock.send(handshake)
                    conn.state = _RawConn.HANDSHAKE
                    ep.modify(fd, select.EPOLLIN)
                    continue
                data = sock.recv(RECEIVE_BYTES)
            except BlockingIOError:
                continue
            except OSError as exc:
                conn.outcome = f"{type(exc).__name__}: {exc}"
                finish(fd, conn)
                continue
            if not data:
                if conn.state != _RawConn.CLOSING:
                    conn.outcome = conn.outcome or "closed before the closing handshake"
                finish(fd, conn)
                continue
            conn.buf += data
            if conn.state == _RawConn.HANDSHAKE:
                end = conn.buf.find(b"\r\n\r\n")
                if end < 0:
                    continue
                response = bytes(conn.buf[: end + 4])
                del conn.buf[: end + 4]
                if not response.startswith(b"HTTP/1.1 101") or accept not in response:
                    conn.outcome = f"handshake failed: {response[:60]!r}"
                    finish(fd, conn)
                    continue
                conn.state = _RawConn.OPEN
                counter += 1
                sock.send(client_frame(0x1, head + f"r{pid}-{counter}".encode() + tail))
            for opcode, payload in frames(conn):
                if opcode == 0x1 and conn.state == _RawConn.OPEN:
                    message = json.loads(payload)
                    kind = message.get("type")
                    if kind == "done":
                        conn.outcome = "" if message.get("ok") is True else f"done not ok: {payload[:200]!r}"
                        sock.send(close_frame)
                    elif kind == "tool_call":
                        sock.send(client_frame(0x1, tool_result(message)))
                elif opcode == 0x8:
                    conn.state = _RawConn.CLOSING  # now wait for the server's TCP close
    ep.close()
    return _load_result(latencies, succeeded, fail_count, failures, cpu0, wall0)


def load_client_main(mode: str, url: str, concurrency: int, duration: float, code: str) -> None:
    """Say ``ready``, wait for ``go`` on stdin, run the load, print the result as JSON."""
    uri = parse_uri(url)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    if mode == "raw":
        result = _raw_load(uri.host, uri.port, concurrency, duration, code)
    else:
        result = asyncio.run(_load(uri, concurrency, duration, code))
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- CPU accounting via /proc


def _proc_times(pid: int) -> tuple[int, int, int]:
    """(ppid, own CPU ticks, CPU ticks of reaped children) from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    # fields[0] is field 3 (state): ppid is field 4, utime/stime/cutime/cstime are fields 14-17.
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def tree_cpu_seconds(root: int) -> tuple[float, float, int]:
    """(CPU seconds of ``root`` itself, of all its descendants live or reaped, live descendants).

    The daemon's workers are children of its zygote (itself a child of the
    daemon), so the whole process tree counts. A process that exits between
    two samples moves from "live" into its parent's reaped-children counters,
    so differences of the second figure stay right. A process reaped during
    the /proc scan would be missed (or counted twice), so the scan is retried
    while the reaped counters move.
    """
    for _ in range(10):
        table: dict[int, tuple[int, int, int]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    table[int(name)] = _proc_times(int(name))
                except (OSError, ValueError, IndexError):
                    continue  # exited meanwhile
        descendants: list[int] = []
        frontier = [root]
        while frontier:
            parent = frontier.pop()
            kids = [pid for pid, (ppid, _, _) in table.items() if ppid == parent]
            descendants += kids
            frontier += kids
        reaped = sum(table[pid][2] for pid in [root, *descendants] if pid in table)
        live = sum(table[pid][1] for pid in descendants)
        if sum(_proc_times(pid)[2] for pid in [root, *descendants] if os.path.exists(f"/proc/{pid}")) == reaped:
            break
    own = table[root][1] if root in table else 0
    return own / CLK_TCK, (reaped + live) / CLK_TCK, len(descendants)


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


# ---------------------------------------------------------------- throughput orchestration


def run_throughput(
    url: str, mode: str, concurrency: int, duration: float, processes: int, code: str, daemon_pid: int | None
) -> dict[str, Any]:
    """Throughput at ``concurrency`` split over ``processes`` client processes, with CPU shares."""
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    clients = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_load-client", mode, url, str(share), str(duration), code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for share in shares
    ]
    results: list[dict[str, Any]] = []
    try:
        for client in clients:
            assert client.stdout is not None
            if client.stdout.readline().strip() != "ready":
                raise RuntimeError("load client failed to start")
        before = tree_cpu_seconds(daemon_pid) if daemon_pid else None
        busy0, total0 = machine_busy_ticks()
        t0 = time.perf_counter()
        for client in clients:
            assert client.stdin is not None
            client.stdin.write("go\n")
            client.stdin.flush()
        for client in clients:
            assert client.stdout is not None
            line = client.stdout.readline()
            if not line:
                raise RuntimeError("load client died")
            results.append(json.loads(line))
        wall = time.perf_counter() - t0
        after = tree_cpu_seconds(daemon_pid) if daemon_pid else None
        busy1, total1 = machine_busy_ticks()
    finally:
        for client in clients:
            try:
                client.wait(timeout=duration + IO_TIMEOUT_S + 5)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()
    completed = sum(r["completed"] for r in results)
    # CPU is measured until the last in-flight execution ends, so it is shared
    # over every execution that succeeded, not only those inside the window.
    served = sum(r["succeeded_total"] for r in results)
    latencies = [x for r in results for x in r["latencies_ms"]]
    client_cpu = sum(r["cpu_s"] for r in results)
    out: dict[str, Any] = {
        "concurrency": concurrency,
        "client_processes": processes,
        "client_mode": mode,
        "duration_s": duration,
        "completed": completed,
        "executions_per_s": round(completed / duration, 1),
        "failures": sum(r["failures"] for r in results),
        "failure_examples": [e for r in results for e in r["failure_examples"]][:3],
        "latency_median_ms": number(percentile(latencies, 0.5), 3),
        "latency_p95_ms": number(percentile(latencies, 0.95), 3),
        "client_cpu_s": round(client_cpu, 3),
        "client_cpu_us_per_exec": round(client_cpu / served * 1e6, 1) if served else None,
        "machine_busy_pct": round(100 * (busy1 - busy0) / max(1, total1 - total0), 1),
        "window_s": round(wall, 3),
    }
    if before and after:
        daemon_cpu = after[0] - before[0]
        workers_cpu = after[1] - before[1]
        total = daemon_cpu + workers_cpu

        def per_exec(seconds: float) -> float | None:
            return round(seconds / served * 1e6, 1) if served else None

        out["daemon_plus_workers_cpu_s"] = round(total, 3)
        out["daemon_cpu_s"] = round(daemon_cpu, 3)
        out["workers_cpu_s"] = round(workers_cpu, 3)
        out["daemon_plus_workers_us_per_exec"] = per_exec(total)
        out["daemon_us_per_exec"] = per_exec(daemon_cpu)
        out["workers_us_per_exec"] = per_exec(workers_cpu)
        out["daemon_cores_used"] = round(daemon_cpu / wall, 2)
        if served:
            # What this box could do with nothing else running: all CPUs shared by daemon, workers
            # and this load client, and the single-threaded daemon limited to one core.
            cpus = os.cpu_count() or 1
            out["capacity_estimate_per_s"] = round(
                min(cpus / ((total + client_cpu) / served), 1 / max(daemon_cpu / served, 1e-9))
            )
        out["live_workers_after"] = after[2]
        machine_s = (busy1 - busy0) / CLK_TCK
        out["other_cpu_pct"] = round(100 * max(0.0, machine_s - total - client_cpu) / wall / (os.cpu_count() or 1), 1)
    return out


# ---------------------------------------------------------------- subprocess helpers


@dataclass
class Server:
    """A server subprocess and the URL it printed."""

    process: subprocess.Popen[str]
    url: str

    def stop(self) -> None:
        """Close its stdin; SIGTERM, then SIGKILL if it lingers (only this process, by its PID)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(argv: list[str], marker: str, stdin: int | None = None) -> Server:
    """Start ``argv`` and wait (bounded) for its ``... listening on ws://...`` line."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=stdin, text=True)
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if marker in line:
            return Server(process, line.strip().rsplit(" ", 1)[-1])
    process.kill()
    process.wait()
    raise RuntimeError(f"{argv[0]} did not report listening")


# ---------------------------------------------------------------- report


def fmt_ms(value: float) -> str:
    return f"{value:8.3f} ms"


def latency_line(stats: LatencyStats) -> str:
    """One human-readable latency result."""
    fail = f"  FAILURES: {stats.failures} {stats.failure_examples}" if stats.failures else ""
    return f"  {stats.name:<26} median {fmt_ms(stats.median)}   p95 {fmt_ms(stats.p95)}   (n={len(stats.samples_ms)}){fail}"


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def latency_section(
    uri: WebSocketURI, echo_uri: WebSocketURI, iterations: int, say: Callable[[str], None], summary: dict[str, Any]
) -> int:
    """Sections 1-3: fresh-connection latencies, marginal tool call, echo baselines and ratios; returns failures.

    The measurements are interleaved round by round (0, 1, 10 tools, bare
    connect+echo+close, 5 bare echoes) so that drifting background load on a
    shared machine hits them all alike.
    """
    tools = (0, 1, 10)
    warm = LatencyStats("warmup")
    for i in range(max(5, iterations // 10)):
        execute_once(uri, warm, f"warmup-{i}", tool_code(1), 0)
        bare_connect_echo_close_once(echo_uri, warm, b"warm")
    lat = {n: LatencyStats(f"{n} tool calls") for n in tools}
    bare_close = LatencyStats("bare connect+echo+close")
    bare_rtt = LatencyStats("bare echo round trip")
    bare_payload = execute_message("bare", tool_code(0))  # the size of a real execute
    rtt_payload = tool_result({"callId": "call-1", "input": {"i": 1}})  # the size of a real tool_result
    rtt_client = BlockingClient(echo_uri)
    rtt_texts = rtt_client.texts()
    for i in range(iterations):
        for n in tools[i % 3 :] + tools[: i % 3]:
            execute_once(uri, lat[n], f"lat{n}-{i}", tool_code(n), n * (n - 1) // 2)
        bare_connect_echo_close_once(echo_uri, bare_close, bare_payload)
        for _ in range(5):
            bare_echo_once(rtt_client, rtt_texts, bare_rtt, rtt_payload)
    rtt_client.close()

    say("\n1. Latency of a full execution, fresh connection each (connect, execute, tools, done, close)")
    for stats in lat.values():
        say(latency_line(stats))
    summary["latency"] = {str(n): s.summary() for n, s in lat.items()}

    say("\n2. Marginal cost per tool call")
    marginal = (lat[10].median - lat[0].median) / 10
    say(f"  (median(10 tools) - median(0 tools)) / 10 = {marginal:.3f} ms")
    summary["marginal_tool_call_ms"] = number(marginal)

    say("\n3. Baselines: bare WebSocket echo server (Sans-I/O ServerProtocol over trio, own process)")
    say(latency_line(bare_close))
    say(latency_line(bare_rtt))
    summary["baseline"] = {"connect_echo_close": bare_close.summary(), "echo_round_trip": bare_rtt.summary()}
    ratio_exec = lat[0].median / bare_close.median
    ratio_tool = marginal / bare_rtt.median
    say(
        f"  0-tool execution / bare connect+echo+close = {ratio_exec:5.2f}x  (target <= {TARGET_EXEC_VS_BARE}x: {verdict(ratio_exec <= TARGET_EXEC_VS_BARE)})"
    )
    say(
        f"  marginal tool call / bare echo round trip  = {ratio_tool:5.2f}x  (target <= {TARGET_TOOL_VS_ECHO}x: {verdict(ratio_tool <= TARGET_TOOL_VS_ECHO)})"
    )
    summary["ratios"] = {
        "exec0_vs_bare_connect_echo_close": number(ratio_exec, 3),
        "exec0_target": TARGET_EXEC_VS_BARE,
        "exec0_met": ratio_exec <= TARGET_EXEC_VS_BARE,
        "tool_vs_bare_echo_rtt": number(ratio_tool, 3),
        "tool_target": TARGET_TOOL_VS_ECHO,
        "tool_met": ratio_tool <= TARGET_TOOL_VS_ECHO,
    }
    return warm.failures + sum(s.failures for s in (*lat.values(), bare_close, bare_rtt))


def wait_pool_settled(daemon_pid: int, limit_s: float = 20.0) -> tuple[float, int]:
    """Wait (at most ``limit_s``) until the daemon's workers stop starting: same count and
    under 5% of a core of worker CPU over half a second. Returns (seconds waited, workers)."""
    t0 = time.perf_counter()
    _, cpu, count = tree_cpu_seconds(daemon_pid)
    while time.perf_counter() - t0 < limit_s:
        time.sleep(0.5)
        _, cpu_now, count_now = tree_cpu_seconds(daemon_pid)
        settled = count_now == count and cpu_now - cpu < 0.025
        cpu, count = cpu_now, count_now
        if settled:
            break
    return time.perf_counter() - t0, count


def throughput_line(result: dict[str, Any]) -> str:
    """One human-readable throughput result (two lines when CPU figures are known)."""
    fail = f"  FAILURES {result['failures']} {result['failure_examples']}" if result["failures"] else ""
    median, p95 = (result[k] if result[k] is not None else math.nan for k in ("latency_median_ms", "latency_p95_ms"))
    text = (
        f"  c={result['concurrency']:<3} {result['executions_per_s']:8.1f} exec/s   median {median:7.2f} ms"
        f"   p95 {p95:7.2f} ms   ({result['client_processes']} {result['client_mode']} client proc){fail}"
    )
    if "daemon_plus_workers_cpu_s" in result:
        text += (
            f"\n         CPU per execution: daemon {result['daemon_us_per_exec']} us + workers {result['workers_us_per_exec']} us"
            f" = {result['daemon_plus_workers_us_per_exec']} us; load client {result['client_cpu_us_per_exec']} us"
            f"\n         daemon process busy {100 * result['daemon_cores_used']:.0f}% of a core; machine busy {result['machine_busy_pct']}%"
            f" (other processes {result['other_cpu_pct']}%); live workers {result['live_workers_after']}"
            f"\n         CPU-bound capacity estimate (idle box, same client): {result.get('capacity_estimate_per_s')} exec/s"
        )
    return text


def throughput_section(
    url: str,
    args: argparse.Namespace,
    duration: float,
    levels: list[int],
    daemon_pid: int | None,
    say: Callable[[str], None],
    summary: dict[str, Any],
) -> int:
    """Section 4: executions/s at each concurrency after a warm-up at the highest; returns failures."""
    say(f"\n4. Throughput ({THROUGHPUT_CODE!r}, fresh connection per execution, {duration:g} s per level)")

    def procs(level: int) -> int:
        return int(args.client_procs) if level >= 16 else 1

    top = max(levels)
    warm = run_throughput(url, args.load_client, top, max(1.0, duration / 2), procs(top), THROUGHPUT_CODE, daemon_pid)
    say(
        f"  warm-up at c={top} (includes the worker pool growing): {warm['executions_per_s']} exec/s, "
        f"{warm['failures']} failures, {warm.get('live_workers_after', '?')} live workers after"
    )
    if daemon_pid:
        waited, workers = wait_pool_settled(daemon_pid)
        say(f"  worker pool settled at {workers} processes {waited:.1f} s after the warm-up")
        warm["pool_settle_wait_s"], warm["pool_workers"] = round(waited, 2), workers
    summary["throughput_warmup"] = warm
    results = [
        run_throughput(url, args.load_client, level, duration, procs(level), THROUGHPUT_CODE, daemon_pid)
        for level in levels
    ]
    for result in results:
        say(throughput_line(result))
    summary["throughput"] = results
    at_64 = next((r for r in results if r["concurrency"] == 64), None)
    if at_64 is not None:
        met = at_64["executions_per_s"] >= TARGET_THROUGHPUT
        say(
            f"  throughput at c=64 = {at_64['executions_per_s']} exec/s  (target >= {TARGET_THROUGHPUT:g}: {verdict(met)})"
        )
        summary["throughput_target_met"] = met
    return sum(r["failures"] for r in results)


def main(argv: list[str] | None = None) -> int:
    """Benchmark entry point (and the hidden ``_echo-server`` / ``_load-client`` subprocess modes)."""
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["_echo-server"]:
        echo_server_main()
        return 0
    if args_list[:1] == ["_load-client"]:
        mode, url, conc, seconds, code = args_list[1:6]
        load_client_main(mode, url, int(conc), float(seconds), code)
        return 0

    parser = argparse.ArgumentParser(description="Loopback benchmark of the execbox runner daemon.")
    parser.add_argument("--url", help="benchmark a running daemon at this ws:// URL instead of starting one")
    parser.add_argument("--daemon-pid", type=int, help="with --url: the daemon's PID, for CPU accounting")
    parser.add_argument(
        "--json", action="store_true", help="print a JSON summary on stdout (the report goes to stderr)"
    )
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--iterations", type=int, help="executions per latency measurement (default 300; quick 30)")
    parser.add_argument("--duration", type=float, help="seconds per throughput level (default 4; quick 1)")
    parser.add_argument("--concurrency", default="1,16,64", help="throughput concurrency levels (default 1,16,64)")
    parser.add_argument(
        "--client-procs", type=int, default=1, help="load client processes for concurrency >= 16 (default 1)"
    )
    parser.add_argument(
        "--load-client",
        choices=("raw", "sansio"),
        default="raw",
        help="throughput client: raw = hand-rolled RFC 6455 on epoll (cheapest, default); "
        "sansio = websockets ClientProtocol over asyncio.Protocol",
    )
    parser.add_argument("--cpu-iterations", type=int, help="CPU-bound guest executions (default 10; quick 3)")
    parser.add_argument(
        "--sections",
        default="latency,throughput,cpu",
        help="comma-separated subset of latency (sections 1-3), throughput, cpu (default: all)",
    )
    parser.add_argument("--warm-workers", type=int, help="passed to the daemon as --warm-workers")
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="extra argument for the daemon (repeatable, e.g. --daemon-arg=--max-workers=8)",
    )
    args = parser.parse_args(args_list)

    iterations = args.iterations or (30 if args.quick else 300)
    duration = args.duration or (1.0 if args.quick else 4.0)
    cpu_iterations = args.cpu_iterations or (3 if args.quick else 10)
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    out: TextIO = sys.stderr if args.json else sys.stdout

    def say(text: str = "") -> None:
        print(text, file=out, flush=True)

    servers: list[Server] = []
    summary: dict[str, Any] = {}
    failures = 0
    started = time.perf_counter()
    try:
        daemon_pid: int | None = args.daemon_pid
        if args.url:
            url = args.url
        else:
            daemon_argv = [
                sys.executable,
                "-m",
                "execbox_runner",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--log-level",
                "WARNING",
            ]
            if args.warm_workers is not None:
                daemon_argv += ["--warm-workers", str(args.warm_workers)]
            daemon_argv += args.daemon_arg
            daemon = start_server(daemon_argv, "listening on ws://")
            servers.append(daemon)
            url, daemon_pid = daemon.url, daemon.process.pid
        uri = parse_uri(url)
        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
        say(
            f"execbox-runner benchmark: daemon {url} (pid {daemon_pid}); {os.cpu_count()} CPUs, load average {' '.join(load)}"
        )
        say(
            f"  latency client: websockets Sans-I/O ClientProtocol over a blocking socket; load client: {args.load_client}"
        )
        say(
            f"  iterations {iterations}, throughput {duration:g} s per level at {levels}, cpu-bound runs {cpu_iterations}"
        )
        summary["config"] = {
            "url": url,
            "iterations": iterations,
            "duration_s": duration,
            "levels": levels,
            "sections": sorted(sections),
            "client_procs": args.client_procs,
            "warm_workers": args.warm_workers,
            "daemon_args": args.daemon_arg,
            "cpus": os.cpu_count(),
            "loadavg_at_start": load,
            "echo_server": "websockets Sans-I/O ServerProtocol over trio (subprocess)",
            "latency_client": "websockets Sans-I/O ClientProtocol over a blocking socket",
            "load_client": args.load_client,
        }

        if "latency" in sections:
            echo = start_server(
                [sys.executable, os.path.abspath(__file__), "_echo-server"], "echo listening on", stdin=subprocess.PIPE
            )
            servers.append(echo)
            failures += latency_section(uri, parse_uri(echo.url), iterations, say, summary)
            echo.stop()
        if "throughput" in sections and levels:
            failures += throughput_section(url, args, duration, levels, daemon_pid, say, summary)
        if "cpu" in sections:
            say("\n5. CPU-bound guest (let s = 0; for (let i = 1; i <= 2e6; i++) s += i; s)")
            cpu_stats = measure_executions(uri, "cpu-bound loop", CPU_CODE, cpu_iterations, CPU_RESULT)
            say(latency_line(cpu_stats))
            summary["cpu_bound"] = cpu_stats.summary()
            failures += cpu_stats.failures

        summary["total_failures"] = failures
        summary["elapsed_s"] = round(time.perf_counter() - started, 1)
        say(f"\nfailed executions: {failures}; elapsed {summary['elapsed_s']} s")
    finally:
        for server in reversed(servers):
            server.stop()
    if args.json:
        print(json.dumps(summary, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
