"""The conformance harness's own WebSocket connection (one thread, websockets' Sans-I/O client):
what a runner may legitimately send arrives whole, its close is reported with its code, and over
TLS many sessions in parallel never stall (websockets' threaded client stalled about one in 200)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from execbox_runner_conformance.connection import connect
from execbox_runner_conformance.runner import run_transcript
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection

from .daemonkit import certificate, execute, running_daemon, scripted_runner


def fragments_and_a_ping(connection: ServerConnection, received: list[Any]) -> None:
    received.append(connection.recv(timeout=5))
    connection.send(["frag", "mented ", "text"])  # one message in three frames
    received.append(connection.ping().wait(timeout=5))  # answered while the client waits in recv
    connection.send(b"\x00binary")
    connection.close(1001, "going away")


def test_fragments_arrive_as_one_message_pings_are_answered_and_the_close_is_reported() -> None:
    with scripted_runner(fragments_and_a_ping) as (url, received), connect(url, close_timeout=5) as ws:
        ws.send("hello")
        assert ws.recv(timeout=5) == "fragmented text"
        assert ws.recv(timeout=5) == b"\x00binary"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
        assert closed.value.rcvd is not None and (closed.value.rcvd.code, closed.value.rcvd.reason) == (
            1001,
            "going away",
        )
        assert received == ["hello", True]


def silent(connection: ServerConnection, received: list[Any]) -> None:
    received.append(connection.recv(timeout=10))


def test_a_silent_runner_times_out_the_wait_and_not_more() -> None:
    with scripted_runner(silent) as (url, _), connect(url, close_timeout=1) as ws:
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            ws.recv(timeout=0.2)
        # At least the wait, and well short of the 10 s the silent runner would hold the connection.
        assert 0.2 <= time.monotonic() - began < 5


SESSIONS, THREADS = 800, 8


def test_many_tls_sessions_in_parallel_none_stalls(tmp_path: Path) -> None:
    """websockets' threaded client read TLS on one thread while writing on another and stalled
    about once in 200 sessions here (the handshake request never sent): 800 must all pass."""
    certfile, keyfile, trusted = certificate(tmp_path)
    failures: list[str] = []

    def sessions(url: str, count: int) -> None:
        for index in range(count):
            try:
                with connect(url, ssl_context=trusted, open_timeout=5, close_timeout=5) as ws:
                    ws.send(execute(f"e{index}", "1"))
                    assert '"started"' in str(ws.recv(timeout=5))
                    assert '"ok":true' in str(ws.recv(timeout=5)).replace(" ", "")
            except Exception as exc:  # every failure is counted, the first few shown
                failures.append(repr(exc))

    with running_daemon("--certfile", str(certfile), "--keyfile", str(keyfile)) as daemon:
        threads = [threading.Thread(target=sessions, args=(daemon.url, SESSIONS // THREADS)) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not failures, (len(failures), failures[:3])


def echo_length(connection: ServerConnection, received: list[Any]) -> None:
    connection.send("ready")
    received.append(len(connection.recv(timeout=10)))


def test_a_large_message_goes_whole_after_a_short_wait() -> None:
    """A read's short timeout is not left on the socket for the writes after it."""
    with scripted_runner(echo_length, max_size=None) as (url, received), connect(url, close_timeout=5) as ws:
        time.sleep(0.2)  # "ready" is in: the read that takes it may wait 20 ms at most
        assert ws.recv(timeout=0.02) == "ready"
        ws.send("x" * (64 << 20))  # longer than that to write
    assert received == [64 << 20]


def not_utf8(connection: ServerConnection, received: list[Any]) -> None:
    received.append(connection.recv(timeout=5))
    connection.socket.sendall(b"\x81\x02\xff\xfe")  # a text frame whose payload is not UTF-8


def test_a_text_frame_that_is_not_utf8_is_a_verdict(tmp_path: Path) -> None:
    path = tmp_path / "utf8.jsonl"
    steps = [{"transcript": "utf8", "description": "a runner that sends bad text"}, {"host": {"type": "ping"}}]
    steps.append({"runner": {"type": "started", "id": "x"}})
    path.write_text("".join(json.dumps(step) + "\n" for step in steps))
    with scripted_runner(not_utf8) as (url, received):
        result = run_transcript(url, path, timeout=5)
    assert received == ['{"type": "ping"}']
    assert not result.passed and "not UTF-8" in result.difference
