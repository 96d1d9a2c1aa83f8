"""Operating the daemon: health, readiness, admission, idle sessions, graceful drain."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from .daemonkit import (
    Daemon,
    HostConnection,
    certificate,
    client,
    execute,
    receive,
    run_to_done,
    running_daemon,
    stop,
)


def fetch(daemon: Daemon, path: str) -> tuple[int, dict[str, str], bytes]:
    host, port = daemon.url.removeprefix("ws://").strip("/").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def get(daemon: Daemon, path: str) -> tuple[int, dict[str, str], dict]:
    status, headers, body = fetch(daemon, path)
    return status, headers, json.loads(body)


def get_text(daemon: Daemon, path: str) -> tuple[int, str]:
    """The status and text body of ``GET path`` (``/metrics``), its content type checked."""
    status, headers, body = fetch(daemon, path)
    assert headers["Content-Type"].startswith("text/plain")
    return status, body.decode()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon("--max-sessions", "2", "--idle-timeout", "0.5") as d:
        yield d


def test_healthz_reports_alive_with_the_enforced_protections(daemon: Daemon) -> None:
    status, headers, body = get(daemon, "/healthz")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert body["status"] == "alive" and body["draining"] is False
    assert body["protections"]["seccomp"]["requested"] is True


def test_readyz_is_ready_once_workers_are_warm(daemon: Daemon) -> None:
    assert get(daemon, "/readyz")[:1] == (200,)


def test_sessions_beyond_the_maximum_get_503_with_retry_after(daemon: Daemon) -> None:
    with client(daemon.url) as first, client(daemon.url) as second:
        with pytest.raises(InvalidStatus) as refused:
            client(daemon.url)
        assert refused.value.response.status_code == 503
        assert refused.value.response.headers["Retry-After"] == "1"
        assert json.loads(refused.value.response.body)["error"] == "busy"
        assert run_to_done(first, "a", "1")["ok"] and run_to_done(second, "b", "2")["ok"]
    time.sleep(0.2)
    with client(daemon.url) as again:  # places are given back when sessions end
        assert run_to_done(again, "c", "3")["result"] == 3


def test_idle_sessions_are_closed(daemon: Daemon) -> None:
    with client(daemon.url) as ws, pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


def test_a_session_outlives_its_handshake_bound_and_idles_only_between_executions() -> None:
    """The session's one timer: the handshake's bound (0.3 s) and the idle timeout (0.5 s) pass
    while an execution awaits its tool for 0.8 s, and neither ends it; once it is done, the idle
    timeout closes the session, measured from then."""
    with running_daemon("--handshake-timeout", "0.3", "--idle-timeout", "0.5") as d, client(d.url) as ws:
        ws.send(execute("long", "return await tools.echo({ n: 1 })", timeoutMs=5000))
        assert receive(ws)["type"] == "started"
        call = receive(ws)
        assert call["type"] == "tool_call"
        time.sleep(0.8)
        ws.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": {"n": 2}}))
        done = receive(ws)
        assert done["type"] == "done" and done["ok"] and done["result"] == {"n": 2}
        finished = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
        assert closed.value.rcvd.reason == "no execute within 0.5 s"
        assert time.monotonic() - finished >= 0.45


UPGRADE = (
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def until_closed(sock: socket.socket) -> bytes:
    """Everything the daemon sends until it closes the connection (bounded by the socket's timeout)."""
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return received


def test_a_host_that_never_answers_the_daemons_close_is_let_go_after_the_close_timeout() -> None:
    """Whatever made the daemon close (an idle session, the drain), the host has --close-timeout to
    answer its close frame; one that never does is disconnected, and the drain does not wait for it."""
    with running_daemon("--idle-timeout", "0.3", "--close-timeout", "0.5", "--drain-grace", "0") as d:
        port = int(d.url.rsplit(":", 1)[1].strip("/"))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
            idle.sendall(UPGRADE)
            received = until_closed(idle)
        assert received.startswith(b"HTTP/1.1 101") and b"\x88" in received  # its close frame, then the end
        silent = socket.create_connection(("127.0.0.1", port), timeout=10)
        with silent:
            silent.sendall(UPGRADE)
            assert silent.recv(4096).startswith(b"HTTP/1.1 101")
            d.process.send_signal(signal.SIGTERM)
            assert b"\x88" in until_closed(silent)  # 1001, then the end: the host never answered
        assert d.process.wait(timeout=20) == 0


def test_sigterm_drains_lets_short_work_finish_and_cancels_the_rest() -> None:
    with running_daemon("--drain-grace", "1.5") as d, client(d.url) as quick, client(d.url) as slow:
        quick.send(execute("quick", "await tools.hang({})"))
        slow.send(execute("slow", "await tools.hang({})"))
        quick_call = [receive(quick), receive(quick)][1]
        [receive(slow), receive(slow)]
        d.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        # Draining: not ready, no new sessions, but running executions go on.
        assert get(d, "/readyz")[0] == 503
        with pytest.raises(InvalidStatus) as refused:
            client(d.url)
        assert refused.value.response.status_code == 503
        quick.send(json.dumps({"type": "tool_result", "callId": quick_call["callId"], "ok": True, "result": 7}))
        assert receive(quick)["result"] == 7
        # The slow one is cancelled when the grace runs out: it still gets its done, then 1001.
        done = receive(slow, timeout=10)
        assert done["error"] == {"code": "timeout", "message": "Execution timed out"}
        with pytest.raises(ConnectionClosed) as closed:
            slow.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert d.process.wait(timeout=20) == 0


def test_a_drain_starts_no_new_execution_on_open_sessions() -> None:
    """An execution started during the drain could not finish either: the grace would cancel it with
    timeout. So an idle session is closed with 1001 at once, and one running an execution right after
    its done: the host takes its next execute to another runner, and the drain ends with the work."""
    with running_daemon("--drain-grace", "600") as d, client(d.url) as running, client(d.url) as idle:
        running.send(execute("running", "await tools.hang({})"))
        call = [receive(running), receive(running)][1]
        d.process.send_signal(signal.SIGTERM)
        assert close_of(idle) == (1001, "the runner is shutting down")
        running.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 7}))
        assert receive(running)["result"] == 7
        assert close_of(running) == (1001, "the runner is shutting down")
        assert d.process.wait(timeout=20) == 0  # with the work, long before the grace


def close_of(ws: HostConnection) -> tuple[int, str]:
    """The code and reason of the daemon's close frame, the next thing ``ws`` receives."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


def test_the_drain_closes_connections_still_in_their_handshake_without_waiting_for_them() -> None:
    """Once the grace is over, a connection that has sent nothing, or part of a request, is closed
    at once, while the drain still waits for a session's closing handshake."""
    with running_daemon("--drain-grace", "0", "--handshake-timeout", "600", "--close-timeout", "600") as d:
        port = int(d.url.rsplit(":", 1)[1].strip("/"))
        with (
            socket.create_connection(("127.0.0.1", port), timeout=20) as session,
            socket.create_connection(("127.0.0.1", port), timeout=20) as silent,
            socket.create_connection(("127.0.0.1", port), timeout=20) as partial,
        ):
            session.sendall(UPGRADE)
            assert session.recv(4096).startswith(b"HTTP/1.1 101")
            partial.sendall(UPGRADE[:40])
            d.process.send_signal(signal.SIGTERM)
            assert session.recv(4096).startswith(b"\x88")  # 1001: the daemon now waits for the host's close
            assert until_closed(silent) == b"" and until_closed(partial) == b""
            assert d.process.poll() is None  # still waiting for the session's closing handshake
        assert d.process.wait(timeout=20) == 0


# ------------------------------------------------------------------ authentication and TLS


def test_sessions_need_a_valid_bearer_token(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# one per line\nfirst-secret\nsecond-secret\n")
    with running_daemon("--tokens-file", str(tokens), "--allowed-origins", "https://host.example") as d:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "Basic first-secret"},
            {"Authorization": "Bearer first-secre"},
        ):
            with pytest.raises(InvalidStatus) as refused:
                client(d.url, additional_headers=headers)
            assert refused.value.response.status_code == 401
            assert refused.value.response.headers["WWW-Authenticate"].startswith("Bearer")
        for token in ("first-secret", "second-secret"):
            with client(d.url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
                assert run_to_done(ws, "authed", "1 + 1")["result"] == 2
        with pytest.raises(InvalidStatus) as forbidden:
            client(d.url, additional_headers={"Authorization": "Bearer first-secret"}, origin="https://evil.example")
        assert forbidden.value.response.status_code == 403
        with client(
            d.url, additional_headers={"Authorization": "Bearer first-secret"}, origin="https://host.example"
        ) as ws:
            assert run_to_done(ws, "origin", "3")["result"] == 3
        assert get(d, "/healthz")[0] == 200  # probes need no token
        lines = d.json_lines(until=lambda lines: sum("refusal" in line for line in lines) >= 5)
        refusals = [line for line in lines if "refusal" in line]
    # Each refusal's line names the peer it refused.
    assert [line["refusal"] for line in refusals] == ["unauthorized"] * 4 + ["origin"]
    assert all(line["peer"].startswith("127.0.0.1:") for line in refusals)


def test_tokens_from_the_environment_work_too() -> None:
    with running_daemon(env={"EXECBOX_RUNNER_TOKENS": "env-secret"}) as d:
        with pytest.raises(InvalidStatus):
            client(d.url)
        with client(d.url, additional_headers={"Authorization": "Bearer env-secret"}) as ws:
            assert run_to_done(ws, "env", "4")["result"] == 4


def test_wss_with_a_real_certificate(tmp_path: Path) -> None:
    certfile, keyfile, trusted = certificate(tmp_path)
    with running_daemon("--certfile", str(certfile), "--keyfile", str(keyfile)) as d:
        assert d.url.startswith("wss://")
        with client(d.url, ssl=trusted) as ws:
            assert run_to_done(ws, "tls", "await tools.echo('secure')")["result"] == "secure"
        with pytest.raises(ssl.SSLError):  # an untrusting client fails the TLS handshake
            client(d.url, ssl=ssl.create_default_context())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--host", "0.0.0.0"], "without authentication"),
        (["--keyfile", "/nonexistent"], "--keyfile needs --certfile"),
        (["--certfile", "/nonexistent"], "No such file"),
    ],
)
def test_unsafe_or_broken_configurations_refuse_to_start(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "execbox_runner", "serve", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and message in result.stderr


# ------------------------------------------------------------------ metrics and logs


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text format (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        if series.split("{", 1)[0] != name:
            continue
        present = dict(part.split("=", 1) for part in series[len(name) :].strip("{}").split(",") if "=" in part)
        if all(present.get(key) == f'"{expected}"' for key, expected in labels.items()):
            return float(value)
    return 0.0


def test_metrics_count_executions_tool_calls_and_refusals(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("secret\n")
    auth = {"Authorization": "Bearer secret"}
    with running_daemon("--tokens-file", str(tokens)) as d:
        with client(d.url, additional_headers=auth) as ws:
            assert run_to_done(ws, "m1", "await tools.echo(1); await tools.echo(2)")["ok"]
            assert run_to_done(ws, "m2", "throw new Error('x')")["error"]["code"] == "runtime_error"
            assert run_to_done(ws, "m3", "1")["ok"]
        with pytest.raises(InvalidStatus):
            client(d.url)
        status, text = get_text(d, "/metrics")
        assert status == 200
    assert metric(text, "execbox_executions_total", outcome="ok", code="") == 2
    assert metric(text, "execbox_executions_total", outcome="error", code="runtime_error") == 1
    assert metric(text, "execbox_tool_calls_total") == 2
    assert metric(text, "execbox_tool_call_duration_seconds_count") == 2
    assert metric(text, "execbox_execution_duration_seconds_count") == 3
    assert metric(text, "execbox_rejected_handshakes_total", reason="unauthorized") == 1
    assert metric(text, "execbox_pool_workers", state="idle") >= 1
    assert "execbox_active_sessions" in text and "execbox_worker_restarts_total" in text


def test_a_log_reader_that_stops_reading_stalls_no_session() -> None:
    """stderr a pipe nobody reads: once it is full the daemon keeps serving, its lines waiting in a
    bounded buffer; read again, they all arrive."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    try:
        with running_daemon(stderr_fd=write) as d:
            os.close(write)
            executions = 600  # ~200 KB of lines, where the pipe holds 64 KiB
            with client(d.url) as ws:
                for index in range(executions):
                    assert run_to_done(ws, f"e{index}", "1")["ok"]
            status, text = get_text(d, "/metrics")
            assert status == 200 and metric(text, "execbox_log_lines_dropped_total") == 0
            logged, deadline = b"", time.monotonic() + 10
            while logged.count(b'"execution_id"') < executions and time.monotonic() < deadline:
                try:
                    logged += os.read(read, 1 << 20)
                except BlockingIOError:
                    time.sleep(0.01)
    finally:
        os.close(read)
    ids = [json.loads(line)["execution_id"] for line in logged.splitlines() if b'"execution_id"' in line]
    assert ids == [f"e{index}" for index in range(executions)]


def test_a_stopping_daemon_writes_the_lines_still_waiting() -> None:
    """The lines of the last executions, logged a moment before SIGTERM, are in the log once the
    daemon has exited (its writing thread gathers for 100 ms, and the drain writes what waits)."""
    with running_daemon() as d:
        with client(d.url) as ws:
            for index in range(20):
                assert run_to_done(ws, f"last-{index}", "1")["ok"]
        assert stop(d.process) == 0
        lines = d.json_lines()
    assert [line["execution_id"] for line in lines if "execution_id" in line] == [f"last-{i}" for i in range(20)]


def test_one_json_log_line_per_execution_without_guest_code_unless_asked() -> None:
    for flag, logged in (("false", False), ("true", True)):
        with running_daemon("--log-guest-code", flag) as d:
            with client(d.url) as ws:
                run_to_done(ws, "logged", "await tools.echo('secret input'); 'secret result'")
                run_to_done(ws, "failing", "null.x")
            text = "\n".join(d.log_lines(until=lambda lines: sum('"execution_id"' in line for line in lines) >= 2))
        lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        executions = {line["execution_id"]: line for line in lines if line.get("logger") == "execbox_runner.executions"}
        assert executions["logged"]["outcome"] == "ok" and executions["logged"]["tool_calls"] == 1
        assert executions["failing"]["error_code"] == "runtime_error"
        assert executions["logged"]["peer"].startswith("127.0.0.1:") and executions["logged"]["duration_ms"] > 0
        # One session: one correlation id (see test_correlation.py)
        assert executions["logged"]["correlation_id"] == executions["failing"]["correlation_id"]
        assert ("guest_code" in executions["logged"]) is logged
        if not logged:  # guest code, tool inputs and results are never logged by default
            assert "secret" not in text


# ------------------------------------------------------------------ records and replay


def test_recorded_sessions_replay_with_no_difference(tmp_path: Path) -> None:
    records = tmp_path / "records"
    with running_daemon("--record-dir", str(records)) as d:
        with client(d.url) as ws:
            assert run_to_done(
                ws,
                "rec-tools",
                "const a = await tools.echo({ n: 1 }); console.log('got', a.n); [a, await tools.echo('two')]",
            )["ok"]
            assert run_to_done(ws, "rec-error", "await tools.echo(1); null.x")["error"]["code"] == "runtime_error"
        with client(d.url) as ws:
            ws.send(execute("rec-cancel", "console.log('busy'); while (true) {}", timeoutMs=60000))
            receive(ws)
            time.sleep(0.1)
            ws.send(json.dumps({"type": "cancel", "id": "rec-cancel"}))
            assert receive(ws)["error"]["code"] == "timeout"
        time.sleep(0.5)
        transcripts = sorted(records.glob("*.jsonl"))
        assert len(transcripts) == 2
        summaries = [json.loads(path.with_suffix(".summary.json").read_text()) for path in transcripts]
        assert [e["id"] for s in summaries for e in s["executions"]] == ["rec-tools", "rec-error", "rec-cancel"]
        # Each record carries its session's correlation id, and still replays.
        assert len({s["correlation_id"] for s in summaries}) == 2
        assert [json.loads(path.read_text().splitlines()[0])["correlation_id"] for path in transcripts] == [
            s["correlation_id"] for s in summaries
        ]
        replay = subprocess.run(
            [sys.executable, "-m", "execbox_runner", "replay", *map(str, transcripts), "--url", d.url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replay.returncode == 0, replay.stdout
        assert replay.stdout.strip().splitlines()[-1] == "2 passed, 0 failed"
        # A record that no longer matches what the runner does is reported, with the difference.
        doctored = tmp_path / "doctored.jsonl"
        doctored.write_text(transcripts[0].read_text().replace('"got 1"', '"got 2"'))
        replay = subprocess.run(
            [sys.executable, "-m", "execbox_runner", "replay", str(doctored), "--url", d.url],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replay.returncode == 1 and "got 2" in replay.stdout and "0 passed, 1 failed" in replay.stdout


def test_a_recorded_execution_slower_than_the_replays_wait_still_replays(tmp_path: Path) -> None:
    """An execution that ran longer than replay's wait for each message (here --timeout 1 against a
    1.5 s timeout): its record says how long to wait for the done, so the replay passes."""
    records = tmp_path / "records"
    with running_daemon("--record-dir", str(records)) as d:
        with client(d.url) as ws:
            assert run_to_done(ws, "slow", "while (true) {}", timeoutMs=1500)["error"]["code"] == "timeout"
        deadline = time.monotonic() + 10  # the transcript takes its name once the session has ended
        while not list(records.glob("*-slow.summary.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        (transcript,) = records.glob("*-slow.jsonl")
        replay = subprocess.run(
            [sys.executable, "-m", "execbox_runner", "replay", str(transcript), "--url", d.url, "--timeout", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
