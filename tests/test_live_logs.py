"""Live logs (the ``live-logs`` extension): opted into at the handshake, lines streamed while the guest
runs, exactly the lines of ``done.logs``; without the opt-in, the wire is the base protocol's."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from execbox_runner_conformance.connection import Connection, connect
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.sync.client import connect as websockets_connect

from execbox_runner.protocol import extensions, ipc
from execbox_runner.protocol.session import SendToHost, Session

from .daemonkit import Daemon, execute, running_daemon
from .test_session import execute as session_execute

LIVE = [(extensions.HEADER, extensions.LIVE_LOGS)]


# ---------------------------------------------------------------- the negotiation and the session (no I/O)


def test_the_runner_turns_on_only_what_it_knows() -> None:
    assert extensions.negotiate([]) == ()
    assert extensions.negotiate(["traces, Live-Logs "]) == ("live-logs",)
    assert extensions.negotiate(["other", "live-logs,live-logs"]) == ("live-logs",)
    assert extensions.negotiate(["live-logs-v2"]) == ()


def streamed(actions: list[Any]) -> tuple[list[str], dict[str, Any] | None]:
    """The lines of the ``log`` messages among ``actions``, and the ``done`` if one came (nothing after it)."""
    lines: list[str] = []
    done = None
    for action in actions:
        if isinstance(action, SendToHost):
            message = json.loads(action.data)
            assert done is None, f"{message} after the done"
            if message["type"] == "log":
                assert message["id"] == "e1" and message["lines"]
                lines += message["lines"]
            elif message["type"] == "done":
                done = message
    return lines, done


batches = st.lists(st.lists(st.text(max_size=30), max_size=4), max_size=6)


@settings(max_examples=200, deadline=None)
@given(
    batches,
    batches,
    st.integers(0, 8),
    st.integers(0, 60),
    st.sampled_from(["finished", "timeout", "cancel"]),
)
def test_the_streamed_lines_are_the_done_logs(
    running: list[list[str]], last: list[list[str]], max_lines: int, max_chars: int, end: str
) -> None:
    options = {"timeoutMs": 1000, "memoryLimitBytes": 1 << 24, "maxLogLines": max_lines, "maxLogChars": max_chars}
    session = Session()
    session.live_logs = True
    actions = session.receive_text(session_execute(options=options), 0.0)
    for lines in running:
        actions += session.worker_tool_calls(ipc.ToolCalls(calls=[], logs=lines), 0.1)
    if end == "cancel":
        actions += session.receive_text(b'{"type":"cancel","id":"e1"}', 0.2)
    elif end == "timeout":
        actions += session.timer(1.0)
    for lines in last[:-1]:  # an aborted worker's last lines, then its end, or the grace's
        actions += session.worker_tool_calls(ipc.ToolCalls(calls=[], logs=lines), 1.001)
    final = last[-1] if last else []
    actions += session.worker_finished(ipc.Finished(ok=True, result=b"1", code=None, message="", logs=final), 1.002)
    lines, done = streamed(actions)
    assert done is not None and done["ok"] is (end == "finished")
    assert lines == done["logs"]
    assert len(lines) <= max_lines


def test_without_the_extension_no_log_message_is_sent() -> None:
    session = Session()
    session.receive_text(session_execute(), 0.0)
    actions = session.worker_tool_calls(ipc.ToolCalls(calls=[], logs=["a"]), 0.1)
    actions += session.worker_finished(ipc.Finished(ok=True, result=b"1", code=None, message="", logs=["b"]), 0.2)
    assert [json.loads(a.data)["type"] for a in actions if isinstance(a, SendToHost)] == ["done"]


# ---------------------------------------------------------------- a real daemon


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as running:
        yield running


def run(
    connection: Connection, code: str, answer: Any = None, cancel_after: str | None = None, **options: Any
) -> list[dict[str, Any]]:
    """Every message of one execution, in order; answers tool calls with ``answer``, and sends a
    cancel once a log line holding ``cancel_after`` came."""
    connection.send(execute("e1", code, **options))
    messages: list[dict[str, Any]] = []
    while not messages or messages[-1]["type"] != "done":
        message = json.loads(connection.recv(10))
        messages.append(message)
        if message["type"] == "tool_call":
            connection.send(
                json.dumps({"type": "tool_result", "callId": message["callId"], "ok": True, "result": answer})
            )
        elif message["type"] == "log" and cancel_after is not None and cancel_after in message["lines"]:
            connection.send(json.dumps({"type": "cancel", "id": "e1"}))
    return messages


def lines_of(messages: list[dict[str, Any]]) -> list[str]:
    return [line for m in messages if m["type"] == "log" for line in m["lines"]]


SLOW_LINES = (
    "for (let i = 0; i < 3; i++) { console.log('line ' + i); const t = Date.now(); while (Date.now() - t < 300) {} }"
)


def test_each_line_arrives_while_the_guest_runs(daemon: Daemon) -> None:
    # The guest never ends of itself: the cancel that ends it goes out once the last line came.
    with connect(daemon.url, additional_headers=LIVE) as connection:
        messages = run(connection, SLOW_LINES + "; while (true) {}", cancel_after="line 2", timeoutMs=30_000)
    done = messages[-1]
    assert done["error"]["code"] == "timeout"
    assert done["logs"] == ["line 0", "line 1", "line 2"] == lines_of(messages)


def test_lines_come_before_the_tool_call_that_follows_them(daemon: Daemon) -> None:
    with connect(daemon.url, additional_headers=LIVE) as connection:
        messages = run(connection, "console.log('asking'); const r = await tools.echo(1); console.log('got', r); r", 5)
    kinds = [(m["type"], m.get("lines")) for m in messages]
    assert kinds == [
        ("started", None),
        ("log", ["asking"]),
        ("tool_call", None),
        ("log", ["got 5"]),
        ("done", None),
    ]


def test_truncation_cuts_the_stream_as_it_cuts_the_done(daemon: Daemon) -> None:
    code = "for (let i = 0; i < 50; i++) console.log('x'.repeat(10) + i)"
    with connect(daemon.url, additional_headers=LIVE) as connection:
        by_lines = run(connection, code, maxLogLines=4)
        by_chars = run(connection, code, maxLogChars=25)
    assert lines_of(by_lines) == by_lines[-1]["logs"] == [f"xxxxxxxxxx{i}" for i in range(4)]
    assert lines_of(by_chars) == by_chars[-1]["logs"] == ["xxxxxxxxxx0", "xxxxxxxxxx1", "xxx"]


def test_a_spinning_guest_that_meets_its_timeout_has_its_line_sent_once_and_in_the_done(daemon: Daemon) -> None:
    # That lines go out while the guest spins, before any deadline: test_each_line_arrives_while_the_guest_runs.
    with connect(daemon.url, additional_headers=LIVE) as connection:
        messages = run(connection, "console.log('spinning'); while (true) {}", timeoutMs=600)
    done = messages[-1]
    assert done["error"]["code"] == "timeout" and done["logs"] == ["spinning"] == lines_of(messages)
    assert [m["type"] for m in messages] == ["started", "log", "done"]


def test_a_cancelled_guest_streams_its_lines_before_its_done(daemon: Daemon) -> None:
    code = "console.log('first'); const t = Date.now(); while (Date.now() - t < 50) {} console.log('second'); while (true) {}"
    with connect(daemon.url, additional_headers=LIVE) as connection:
        messages = run(connection, code, cancel_after="second", timeoutMs=20_000)
    done = messages[-1]
    assert done["error"]["code"] == "timeout"
    assert lines_of(messages) == done["logs"] == ["first", "second"]


def test_without_the_header_the_wire_is_the_base_protocol(daemon: Daemon) -> None:
    with websockets_connect(daemon.url, open_timeout=10) as plain:
        assert extensions.HEADER not in plain.response.headers
    with connect(daemon.url) as connection:
        messages = run(connection, SLOW_LINES)
    assert [m["type"] for m in messages] == ["started", "done"]
    assert messages[-1]["logs"] == ["line 0", "line 1", "line 2"]


def handshake(url: str, header: str, split: bool) -> str:
    """The 101's header block for a handshake offering ``header``; ``split`` sends the request in
    two writes, which takes websockets' own path instead of the plain one."""
    host, port = url.removeprefix("ws://").rstrip("/").split(":")
    request = (
        f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{header}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        if split:
            sock.sendall(request[:20])
            time.sleep(0.1)
            sock.sendall(request[20:])
        else:
            sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            assert chunk, f"closed after {answer!r}"
            answer += chunk
    return answer.split(b"\r\n\r\n")[0].decode()


@pytest.mark.parametrize("split", [False, True], ids=["plain path", "websockets path"])
def test_the_runner_answers_what_it_turned_on_on_either_path(daemon: Daemon, split: bool) -> None:
    offered = handshake(daemon.url, "Execbox-Extensions: something-else, live-logs", split)
    assert offered.startswith("HTTP/1.1 101") and "\r\nExecbox-Extensions: live-logs" in offered
    unknown = handshake(daemon.url, "Execbox-Extensions: something-else", split)
    assert unknown.startswith("HTTP/1.1 101") and "Execbox-Extensions" not in unknown


def test_a_recorded_session_names_its_extensions_for_its_replay(tmp_path: Path) -> None:
    with running_daemon("--record-dir", str(tmp_path)) as recording:
        with connect(recording.url, additional_headers=LIVE) as connection:
            run(connection, "console.log('x'); 1")
        with connect(recording.url) as connection:
            run(connection, "2")
        deadline = time.monotonic() + 10
        while len(list(tmp_path.glob("*.summary.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    headers = [json.loads(path.read_text().splitlines()[0]) for path in sorted(tmp_path.glob("*.jsonl"))]
    assert sorted(header.get("extensions", []) for header in headers) == [[], ["live-logs"]]
