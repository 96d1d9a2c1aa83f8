"""The HTTP edge of a real daemon over real sockets (issue 11, sections 4-5): ambiguous
credentials, pipelined probes, peers that reset or stop reading during a drain, and a flood
of connections that never send a handshake."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import resource
import signal
import socket
import struct
import termios
import time
from collections.abc import Iterator

import pytest
from websockets.exceptions import ConnectionClosed

from execbox_runner.daemon.observability.endpoints import REFUSAL_LINES_BURST, REFUSAL_LINES_PER_S
from execbox_runner.daemon.server import MAX_HANDSHAKES

from .daemonkit import Daemon, children_of, client, execute, receive, run_to_done, running_daemon

TOKEN = "edge-token"
ALLOWED = "https://host.example"
UPGRADE = (
    "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
SOCKET_TIMEOUT_S = 10.0
# The flood: more idle connections than the daemon's descriptors, at the common soft limit.
FLOOD_CONNECTIONS = 1100
FLOOD_NOFILE = 1024
UNREAD_DONE_BYTES = 1000  # more than a started message: part of the done waits in the buffer


def address(daemon: Daemon) -> tuple[str, int]:
    host, _, port = daemon.url.split("//")[1].rstrip("/").rpartition(":")
    return host, int(port)


def exchange(daemon: Daemon, data: bytes) -> bytes:
    """Send ``data`` in one write and read until the daemon closes the connection."""
    with socket.create_connection(address(daemon), timeout=SOCKET_TIMEOUT_S) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def assert_no_error_logged(daemon: Daemon) -> None:
    lines = [json.loads(line) for line in daemon.log_lines() if line.startswith("{")]
    assert [line for line in lines if line["level"] == "error" or "exception" in line] == []


def masked_text(payload: bytes) -> bytes:
    """A client text frame (masked, as RFC 6455 requires), for a peer written by hand."""
    mask = os.urandom(4)
    size = len(payload)
    length = bytes([0x80 | size]) if size < 126 else bytes([0x80 | 127]) + struct.pack("!Q", size)
    return b"\x81" + length + mask + bytes(byte ^ mask[index % 4] for index, byte in enumerate(payload))


@contextlib.contextmanager
def stuck_peer(daemon: Daemon, exec_id: str) -> Iterator[socket.socket]:
    """A session whose host asks for a 12 MB result and then never reads again."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(SOCKET_TIMEOUT_S)
        sock.connect(address(daemon))
        sock.sendall((UPGRADE + "\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 101")
        sock.sendall(masked_text(execute(exec_id, "'x'.repeat(12_000_000)").encode()))
        for _ in range(600):  # until the daemon is sending the done, which cannot all fit
            if struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0" * 4))[0] > UNREAD_DONE_BYTES:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the daemon never started sending the result")
        yield sock


# ------------------------------------------------------------------ ambiguous credentials


@pytest.mark.parametrize(
    "headers",
    [
        [f"Authorization: Bearer {TOKEN}", "Authorization: Bearer wrong"],
        ["Authorization: Bearer wrong", f"Authorization: Bearer {TOKEN}"],
        [f"Authorization: Bearer {TOKEN}", f"Authorization: Bearer {TOKEN}"],
        [f"Authorization: Bearer {TOKEN}", f"Origin: {ALLOWED}", "Origin: https://other.example"],
        [f"Authorization: Bearer {TOKEN}", "Origin: https://other.example", f"Origin: {ALLOWED}"],
    ],
)
def test_repeated_credentials_are_refused_never_dropped(headers: list[str]) -> None:
    with running_daemon("--tokens", TOKEN, "--allowed-origins", ALLOWED) as d:
        answer = exchange(d, (UPGRADE + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode())
        status = int(answer.split(b" ", 2)[1])
        assert status in (400, 401, 403), answer
        # The same handshake with one of each header is a session: only the repetition is refused.
        with client(d.url, additional_headers={"Authorization": f"Bearer {TOKEN}"}, origin=ALLOWED) as ws:
            assert run_to_done(ws, "after", "1 + 1")["result"] == 2
        assert_no_error_logged(d)


def test_a_browser_origin_is_refused_unless_listed() -> None:
    """A loopback daemon without tokens ran an execution for any web page the user visited: browsers
    send an Origin with a WebSocket handshake (which CORS does not bind), hosts send none."""
    with running_daemon() as d:
        for origin in ("http://evil.example", "null", "http://127.0.0.1:8000"):
            answer = exchange(d, (UPGRADE + f"Origin: {origin}\r\n\r\n").encode())
            assert answer.startswith(b"HTTP/1.1 403"), (origin, answer)
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"] == "origin"
        with client(d.url) as ws:  # no Origin: a host
            assert run_to_done(ws, "host", "1 + 1")["result"] == 2
    with running_daemon("--allowed-origins", f"{ALLOWED}, http://localhost:3000") as d:
        for origin in (ALLOWED, "http://localhost:3000"):
            with client(d.url, origin=origin) as ws:
                assert run_to_done(ws, "page", "1 + 1")["result"] == 2
        answer = exchange(d, (UPGRADE + "Origin: http://evil.example\r\n\r\n").encode())
        assert answer.startswith(b"HTTP/1.1 403"), answer


# ------------------------------------------------------------------ pipelined requests


def test_a_head_request_gets_the_answers_status_and_headers_without_its_body() -> None:
    with running_daemon() as d:
        for path in ("/healthz", "/readyz", "/metrics"):
            with socket.create_connection(address(d), timeout=SOCKET_TIMEOUT_S) as sock:
                sock.sendall(f"HEAD {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
                answer = b""
                while chunk := sock.recv(65536):  # the daemon closes after its answer
                    answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == b"", (path, answer)
            assert int(re.search(rb"Content-Length: (\d+)", head)[1]) > 0  # the length a GET's body has


def test_pipelined_probes_get_the_first_answered_then_a_close() -> None:
    with running_daemon() as d:
        answer = exchange(d, HEALTHZ + HEALTHZ)
        assert answer.count(b"HTTP/1.1") == 1 and answer.startswith(b"HTTP/1.1 200 OK"), answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["status"] == "alive"
        # A handshake followed by something that is not WebSocket frames is refused, not half-opened.
        answer = exchange(d, (UPGRADE + "\r\n").encode() + HEALTHZ)
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert_no_error_logged(d)


# ------------------------------------------------------------------ peers that reset


def test_a_peer_that_resets_its_connection_is_an_info_line() -> None:
    """A session's reset is an info line with its correlation id; a connection reset during its
    handshake (anyone can open one, many a second) is only a debug line, so it costs no log."""
    with running_daemon() as d:
        for _ in range(20):
            with socket.create_connection(address(d), timeout=SOCKET_TIMEOUT_S) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # a handshake begun
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        for code in ("1 + 1", "await tools.hang()"):
            with client(d.url) as ws:
                ws.send(execute("reset", code))
                receive(ws)  # started
                ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                ws.socket.close()  # a reset, not a close
        with client(d.url) as ws:  # the reset went to the daemon's log before this session's line
            assert run_to_done(ws, "after", "2")["result"] == 2
        lines = d.json_lines(until=lambda lines: any(line.get("execution_id") == "after" for line in lines))
        lost = [line for line in lines if line["message"].startswith("connection from 127.0.0.1:")]
        assert len(lost) == 2 and {line["level"] for line in lost} == {"info"}, lost
        assert "reset" in lost[0]["message"]
        resets = {line["correlation_id"] for line in lines if line.get("execution_id") == "reset"}
        assert len(resets) == 2 and {line["correlation_id"] for line in lost} == resets
        assert_no_error_logged(d)


# ------------------------------------------------------------------ a peer that stopped reading


def test_a_peer_that_stopped_reading_is_dropped_with_a_warning_naming_its_session() -> None:
    with running_daemon("--send-timeout", "1") as d:
        with stuck_peer(d, "stuck"):
            lines = d.json_lines(until=lambda lines: any("read nothing" in line["message"] for line in lines))
            with client(d.url) as ws:  # the daemon goes on serving others
                assert run_to_done(ws, "after", "2")["result"] == 2
        [dropped] = [line for line in lines if "read nothing" in line["message"]]
        assert dropped["level"] == "warning"
        assert dropped["message"].startswith("dropping the connection from 127.0.0.1:")
        stuck = {line["correlation_id"] for line in lines if line.get("execution_id") == "stuck"}
        assert stuck == {dropped["correlation_id"]}


# ------------------------------------------------------------------ drain with a peer that stopped reading


def test_a_drain_with_peers_that_stopped_reading_closes_every_other_session_and_exits_0() -> None:
    with running_daemon("--drain-grace", "0.2", "--send-timeout", "2") as d, contextlib.ExitStack() as hosts:
        with stuck_peer(d, "stuck-1"), stuck_peer(d, "stuck-2"):
            waiting = [hosts.enter_context(client(d.url)) for _ in range(3)]
            for index, ws in enumerate(waiting):
                ws.send(execute(f"waiting-{index}", "await tools.hang()"))
                assert [receive(ws)["type"], receive(ws)["type"]] == ["started", "tool_call"]
            idle = [hosts.enter_context(client(d.url)) for _ in range(6)]
            with client(d.url) as ws:  # the stuck sessions' results are on their way by now
                assert run_to_done(ws, "probe", "0")["ok"]
            d.process.send_signal(signal.SIGTERM)
            for ws in waiting:
                assert receive(ws)["error"]["code"] == "timeout"
            for ws in waiting + idle:
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=SOCKET_TIMEOUT_S)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
            assert d.process.wait(timeout=30) == 0
        assert_no_error_logged(d)


# ------------------------------------------------------------------ handshake flood


def test_every_daemon_process_raises_its_descriptor_limit_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= FLOOD_NOFILE:
        pytest.skip("needs a finite hard descriptor limit above the common soft one")
    resource.setrlimit(resource.RLIMIT_NOFILE, (FLOOD_NOFILE, hard))  # inherited by the daemon
    try:
        with running_daemon("--processes", "2") as d:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            with client(d.url) as ws:  # the shards are serving
                assert run_to_done(ws, "up", "1")["ok"]
            daemons = [d.process.pid, *[pid for pid in children_of(d.process.pid) if is_execbox(pid)]]
            assert len(daemons) == 3  # the supervisor and its two shards
            assert [resource.prlimit(pid, resource.RLIMIT_NOFILE)[0] for pid in daemons] == [hard] * 3
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def is_execbox(pid: int) -> bool:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return b"execbox_runner\0serve" in cmdline.read()


def test_a_host_gets_through_a_flood_of_idle_connections_at_the_descriptor_limit() -> None:
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < FLOOD_CONNECTIONS + 256:
        pytest.skip("this test process cannot hold the flood")
    # A long handshake timeout: without shedding, nothing would free a descriptor for the host.
    with running_daemon("--handshake-timeout", "120") as d:
        resource.prlimit(d.process.pid, resource.RLIMIT_NOFILE, (FLOOD_NOFILE, FLOOD_NOFILE))
        flood: list[socket.socket] = []
        try:
            for _ in range(FLOOD_CONNECTIONS):
                idle = socket.socket()
                flood.append(idle)
                idle.connect(address(d))  # completed by the kernel's backlog; never sends a byte
            with client(d.url) as ws:
                assert run_to_done(ws, "through", "await tools.echo(21) * 2")["result"] == 42
        finally:
            for idle in flood:
                idle.close()
        assert_no_error_logged(d)


def test_idle_handshakes_are_bounded_and_the_oldest_are_shed_first() -> None:
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < FLOOD_CONNECTIONS + 256:
        pytest.skip("this test process cannot hold the flood")
    started = time.monotonic()  # every shed connection comes later
    with running_daemon("--handshake-timeout", "120") as d, contextlib.ExitStack() as flood:
        idle = [flood.enter_context(socket.create_connection(address(d))) for _ in range(FLOOD_CONNECTIONS)]
        with client(d.url) as ws:  # accepted after the flood: the daemon has seen all of it
            assert run_to_done(ws, "through", "1")["ok"]
        idle[0].settimeout(SOCKET_TIMEOUT_S)
        assert idle[0].recv(1) == b""  # the oldest was closed by the daemon
        idle[-1].setblocking(False)
        with pytest.raises(BlockingIOError):  # the newest still waits for its handshake
            idle[-1].recv(1)
        metrics = exchange(d, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").decode()
        shed = re.search(r'execbox_rejected_handshakes_total\{reason="shed"\} (\S+)', metrics)
        assert shed is not None and float(shed.group(1)) >= FLOOD_CONNECTIONS - MAX_HANDSHAKES
        # Each shed connection is a line naming its peer, or part of a summary line: a few a second.
        deadline = time.monotonic() + SOCKET_TIMEOUT_S
        while True:
            lines = [json.loads(line) for line in d.log_lines() if line.startswith("{")]
            logged = [line for line in lines if line.get("refusal") == "shed" and "suppressed" not in line]
            suppressed = sum(line.get("suppressed", 0) for line in lines if line.get("refusal") == "shed")
            if len(logged) + suppressed >= float(shed.group(1)) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert len(logged) + suppressed == float(shed.group(1))
        assert 0 < len(logged) <= REFUSAL_LINES_BURST + REFUSAL_LINES_PER_S * (time.monotonic() - started)
        assert all(line["peer"].startswith("127.0.0.1:") for line in logged)
        assert_no_error_logged(d)


def test_a_host_reading_slowly_is_no_flood_of_its_worker_at_a_large_output_limit() -> None:
    """With --max-output-bytes at 48 MiB, an unawaited call of 48 MB and the lines it logged (live)
    wait unread at a host that reads slowly, past the daemon's 64 MiB of a slot's backlog: the
    worker's next message (the timeout's) had it judged as flooding, and killed with every
    execution it hosted (another session's with internal_error)."""
    output = 48 << 20
    args = ("--max-output-bytes", str(output), "--max-message-bytes", str(1 << 20))
    code = f"""tools.echo('x'.repeat({output - 100}));
    for (let i = 0; i < 100; i++) console.log('\\x01'.repeat({output // 600})); await tools.echo(1)"""
    with running_daemon(*args, "--warm-workers", "1", "--max-workers", "1") as d, client(d.url) as other:
        other.send(execute("victim", "await tools.echo(1) + 1", timeoutMs=60_000))
        assert receive(other)["type"] == "started"
        call = receive(other)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(address(d))
            sock.sendall((UPGRADE + "Execbox-Extensions: live-logs\r\n\r\n").encode())
            limits = {"timeoutMs": 3000, "memoryLimitBytes": 256 << 20, "maxLogChars": output}
            sock.sendall(masked_text(execute("slow", code, **limits).encode()))
            ended = d.json_lines(lambda lines: any(line.get("execution_id") == "slow" for line in lines))
            assert [line["error_code"] for line in ended if line.get("execution_id") == "slow"] == ["timeout"]
            other.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 1}))
            done = receive(other)
    assert (done["ok"], done.get("result")) == (True, 2), done.get("error")
