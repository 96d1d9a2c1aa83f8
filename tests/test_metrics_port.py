"""What a runner tells about itself need not be public (issue 14, item 6): ``--metrics-port``
takes ``/metrics`` and the detailed ``/healthz`` off the sessions' port, a metrics token
guards them, and the probes (``/readyz``, a bare ``/healthz``) keep answering everyone, with
one process or several. Real daemons over real sockets."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus

from .daemonkit import Daemon, certificate, client, run_to_done, running_daemon
from .test_deploy import free_port
from .test_http_edge import UPGRADE
from .test_operations import metric
from .test_settings import run

TOKEN = "session-token"
METRICS_TOKEN = "metrics-token"
BARE = {"status": "alive"}
SOCKET_TIMEOUT_S = 10.0


def main_port(daemon: Daemon) -> int:
    return int(daemon.url.rstrip("/").rsplit(":", 1)[1])


def get(
    port: int, path: str, token: str | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, str, dict[str, str]]:
    """Status, body and headers of GET ``path`` on 127.0.0.1:``port``, with ``token`` as a bearer."""
    connection: http.client.HTTPConnection = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=SOCKET_TIMEOUT_S, context=context)
        if context
        else http.client.HTTPConnection("127.0.0.1", port, timeout=SOCKET_TIMEOUT_S)
    )
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        answer = connection.getresponse()
        return answer.status, answer.read().decode(), dict(answer.getheaders())
    finally:
        connection.close()


def health(port: int, token: str | None = None, context: ssl.SSLContext | None = None) -> dict[str, object]:
    status, body, _ = get(port, "/healthz", token, context)
    assert status == 200
    loaded: dict[str, object] = json.loads(body)
    return loaded


def test_a_metrics_port_takes_the_details_off_the_sessions_port() -> None:
    metrics_port = free_port()
    with running_daemon("--tokens", TOKEN, "--metrics-port", str(metrics_port), "--handshake-timeout", "1") as d:
        sessions_port = main_port(d)
        # The sessions' port: the probes, no token needed, and nothing about the runner.
        assert health(sessions_port) == BARE
        assert get(sessions_port, "/readyz")[:2] == (200, '{"status": "ready"}')
        status, body, _ = get(sessions_port, "/metrics")
        assert status == 404 and "metrics port" in body
        with client(d.url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
            assert run_to_done(ws, "one", "await tools.echo(1)")["result"] == 1
        # The metrics port: the details, the probes too, and nothing else.
        detailed = health(metrics_port)
        assert detailed["unsafe_settings"] == [] and "protections" in detailed and "memory" in detailed
        status, text, headers = get(metrics_port, "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert metric(text, "execbox_executions_total", outcome="ok", code="") == 1
        assert get(metrics_port, "/readyz")[0] == 200
        assert get(metrics_port, "/")[0] == 404
        with pytest.raises(InvalidStatus, match="404"):  # no sessions there, whatever the token
            client(f"ws://127.0.0.1:{metrics_port}/", additional_headers={"Authorization": f"Bearer {TOKEN}"})
        # A connection that sends nothing is closed after the handshake timeout, like on the sessions' port.
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=SOCKET_TIMEOUT_S) as idle:
            started = time.monotonic()
            assert idle.recv(1) == b""
            assert time.monotonic() - started < 5  # the 1 s of --handshake-timeout, not the default 10 s
        # Garbage gets the answer (or the close) of the sessions' port, and the port keeps serving.
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=SOCKET_TIMEOUT_S) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\n" + b"X-Long: " + b"x" * 10_000 + b"\r\n\r\n")
            assert sock.recv(100).startswith(b"HTTP/1.1 431")
        assert get(metrics_port, "/metrics")[0] == 200


def test_a_metrics_token_guards_the_details_but_never_the_probes(tmp_path: Path) -> None:
    tokens = tmp_path / "metrics-tokens"
    tokens.write_text(f"# rotated monthly\nold-metrics-token\n{METRICS_TOKEN}\n")
    with running_daemon("--tokens", TOKEN, "--metrics-token-file", str(tokens)) as d:
        port = main_port(d)
        for token in (None, "wrong", TOKEN):  # a session token is no metrics token
            status, body, headers = get(port, "/metrics", token)
            assert (status, headers["WWW-Authenticate"]) == (401, 'Bearer realm="execbox-runner"'), body
            assert health(port, token) == BARE
        for token in (METRICS_TOKEN, "old-metrics-token"):
            assert get(port, "/metrics", token)[0] == 200
            assert "protections" in health(port, token)
        assert get(port, "/readyz")[0] == 200
        # Two Authorization headers are ambiguous, even if one holds the metrics token.
        with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S) as sock:
            sock.sendall(
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + METRICS_TOKEN.encode()
                + b"\r\nAuthorization: Bearer wrong\r\n\r\n"
            )
            assert sock.recv(100).startswith(b"HTTP/1.1 401")
        # Sessions still need their own token, and only that.
        with pytest.raises(InvalidStatus, match="401"):
            client(d.url, additional_headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
        with socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_S) as sock:
            sock.sendall((UPGRADE + f"Authorization: Bearer {TOKEN}\r\n\r\n").encode())
            assert sock.recv(100).startswith(b"HTTP/1.1 101")


def test_the_metrics_port_speaks_tls_when_the_sessions_port_does(tmp_path: Path) -> None:
    certfile, keyfile, trusted = certificate(tmp_path)
    metrics_port = free_port()
    args = ("--certfile", str(certfile), "--keyfile", str(keyfile), "--metrics-port", str(metrics_port))
    with running_daemon(*args, "--metrics-token", METRICS_TOKEN) as d:
        assert d.url.startswith("wss://")
        assert get(metrics_port, "/metrics", METRICS_TOKEN, trusted)[0] == 200
        assert get(metrics_port, "/metrics", None, trusted)[0] == 401
        assert health(main_port(d), None, trusted) == BARE
        with pytest.raises((http.client.HTTPException, OSError)):  # no clear text, even for the probes
            get(metrics_port, "/healthz")


def test_shards_share_the_metrics_port_and_each_answers_for_all() -> None:
    metrics_port = free_port()
    with running_daemon(
        "--processes", "2", "--warm-workers", "2", "--max-sessions", "10", "--metrics-port", str(metrics_port)
    ) as d:
        for index in range(8):
            with client(d.url) as ws:
                assert run_to_done(ws, f"e{index}", "1 + 1")["result"] == 2
        time.sleep(1)  # the shards' live state is published every half second
        for _ in range(6):  # the kernel spreads these over both shards
            status, text, _ = get(metrics_port, "/metrics")
            assert status == 200
            assert metric(text, "execbox_executions_total", outcome="ok", code="") == 8
            assert metric(text, "execbox_max_sessions") == 10
        assert get(main_port(d), "/metrics")[0] == 404
        assert health(main_port(d)) == BARE
        assert len([line for line in d.log_lines() if '"shard"' in line and "serving" in line]) == 2


def test_a_taken_metrics_port_is_one_line_and_exit_1() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run("serve", "--port", "0", "--processes", "1", "--metrics-port", str(port), "--warm-workers", "0")
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"execbox-runner: cannot serve on 127.0.0.1:{port}: Address already in use"
        " (another process listens there: stop it, or choose another port)"
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--metrics-port", "70000"], "invalid --metrics-port '70000': must be a port number 0-65535"),
        (["--metrics-port", "-1"], "must be a port number 0-65535"),
        (["--port", "9100", "--metrics-port", "9100"], "--metrics-port 9100 is --port too: they must differ"),
        (["--metrics-host", "127.0.0.1"], "--metrics-host needs --metrics-port"),
        (["--metrics-token-file", "/nonexistent/token"], "invalid --metrics-token-file '/nonexistent/token': No such"),
    ],
)
def test_metrics_settings_are_checked_like_the_others(args: list[str], expected: str) -> None:
    result = run("serve", *args)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert expected in line, line


def test_a_metrics_token_file_without_a_token_is_refused(tmp_path: Path) -> None:
    """It would leave /metrics open while the operator believes it guarded."""
    empty = tmp_path / "metrics-token"
    empty.write_text("# no token yet\n\n")
    result = run("serve", "--metrics-token-file", str(empty))
    assert result.returncode == 2
    assert result.stderr.strip().endswith(f"'{empty}': holds no token (it would leave /metrics open)")
    result = run("info", env={"EXECBOX_RUNNER_METRICS_TOKEN_FILE": str(empty)})
    assert result.returncode == 2 and "holds no token" in result.stderr
