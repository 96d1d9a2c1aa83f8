"""Code mode over HTTP is closed by default: Host and Origin are checked at any address, a bearer
token is needed off loopback (and honoured on it), and the command refuses to serve a non-loopback
address without one, in one line, with exit status 2 (``mcp/access.py``)."""

from __future__ import annotations

import http.client
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from execbox_runner.mcp.access import Access, default_hosts, http_access

from .daemonkit import Daemon, running_daemon, stop
from .test_mcp import free_port, listening

TOKEN = "mcp-http-token"
INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
)


# ---------------------------------------------------------------- the rules


def test_the_host_must_be_allowed() -> None:
    access = Access(default_hosts("127.0.0.1"))
    assert access.refusal([("host", "127.0.0.1:8000")]) is None
    assert access.refusal([("host", "localhost:1")]) is None
    assert access.refusal([("host", "localhost")]) is None
    assert access.refusal([("host", "[::1]:8000")]) is None
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example:8000", "localhostx:1"):
        assert access.refusal([("host", host)]) == (403, f"Host {host} is not allowed (see --allowed-hosts)")
    assert access.refusal([]) is not None
    assert access.refusal([("host", "127.0.0.1:1"), ("host", "127.0.0.1:1")]) is not None
    assert Access(default_hosts("10.1.2.3")).refusal([("host", "10.1.2.3:8000")]) is None
    assert Access(default_hosts("0.0.0.0")).refusal([("host", "10.1.2.3:8000")]) is not None
    assert Access(("mcp.example:443",)).refusal([("host", "mcp.example:443")]) is None
    assert Access(("mcp.example:443",)).refusal([("host", "mcp.example:8443")]) is not None


def test_an_origin_must_be_absent_or_allowed() -> None:
    host = ("host", "127.0.0.1:8000")
    assert Access(default_hosts("127.0.0.1")).refusal([host, ("origin", "http://127.0.0.1:8000")]) is not None
    assert Access(default_hosts("127.0.0.1")).refusal([host, ("origin", "null")]) is not None
    allowed = Access(default_hosts("127.0.0.1"), origins=("http://localhost:*", "https://app.example"))
    assert allowed.refusal([host, ("origin", "http://localhost:6274")]) is None
    assert allowed.refusal([host, ("origin", "https://app.example")]) is None
    assert allowed.refusal([host, ("origin", "https://app.example.evil")]) is not None
    assert allowed.refusal([host, ("origin", "https://app.example"), ("origin", "https://app.example")]) is not None


def test_with_tokens_one_bearer_header_with_one_of_them_is_needed() -> None:
    access = Access(default_hosts("127.0.0.1"), tokens=(TOKEN.encode(), b"other"))
    host = ("host", "127.0.0.1:8000")
    assert access.refusal([host, ("authorization", f"Bearer {TOKEN}")]) is None
    assert access.refusal([host, ("authorization", "bearer other")]) is None
    refused = (401, "exactly one Authorization header with a valid bearer token is required")
    for headers in (
        [host],
        [host, ("authorization", "Bearer wrong")],
        [host, ("authorization", f"Basic {TOKEN}")],
        [host, ("authorization", f"Bearer {TOKEN}"), ("authorization", f"Bearer {TOKEN}")],
    ):
        assert access.refusal(headers) == refused


def test_a_non_loopback_address_needs_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXECBOX_RUNNER_MCP_TOKEN", raising=False)
    options = {"tokens": "", "token_file": "", "hosts": "", "origins": "", "allow_unauthenticated": False}
    assert http_access("127.0.0.1", **options).tokens == ()
    with pytest.raises(ValueError, match=r"refusing to serve 0\.0\.0\.0 without authentication"):
        http_access("0.0.0.0", **options)
    assert http_access("0.0.0.0", **{**options, "allow_unauthenticated": True}).tokens == ()
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# the MCP clients' tokens\n{TOKEN}\n\n")
    assert http_access("10.0.0.1", **{**options, "token_file": str(tokens)}).tokens == (TOKEN.encode(),)
    monkeypatch.setenv("EXECBOX_RUNNER_MCP_TOKEN", "from-env")
    assert http_access("10.0.0.1", **options).tokens == (b"from-env",)
    with pytest.raises(ValueError, match="cannot read --http-token-file"):
        http_access("127.0.0.1", **{**options, "token_file": str(tmp_path / "missing")})
    tokens.write_text("fine\nse cret\n")  # no MCP client could send it; the error never shows it
    with pytest.raises(
        ValueError, match=r"^--http-token or --http-token-file: line 2: the token must be printable"
    ) as refused:
        http_access("10.0.0.1", **{**options, "token_file": str(tokens)})
    assert "cret" not in str(refused.value)


# ---------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


@pytest.fixture
def servers_json(tmp_path: Path) -> Path:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {}}))
    return path


def mcp_command(servers_json: Path, daemon: Daemon, *extra: str) -> list[str]:
    base = [sys.executable, "-m", "execbox_runner", "mcp", "--config", str(servers_json), "--url", daemon.url]
    return [*base, "--transport", "http", *extra]


def test_serving_a_non_loopback_address_without_a_token_is_refused_in_one_line(
    servers_json: Path, daemon: Daemon
) -> None:
    argv = mcp_command(servers_json, daemon, "--host", "0.0.0.0", "--port", str(free_port()))
    environment = {key: value for key, value in os.environ.items() if key != "EXECBOX_RUNNER_MCP_TOKEN"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "execbox-runner mcp: refusing to serve 0.0.0.0 without authentication: give --http-token-file"
        " (or --http-token, $EXECBOX_RUNNER_MCP_TOKEN), or pass --allow-unauthenticated"
    ]
    missing = [*argv, "--http-token-file", str(servers_json.parent / "missing")]
    done = subprocess.run(missing, capture_output=True, text=True, timeout=60, env=environment)
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "cannot read" in done.stderr


def test_port_0_says_which_port_it_picked(servers_json: Path, daemon: Daemon) -> None:
    argv = mcp_command(servers_json, daemon, "--port", "0")
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        lines: queue.Queue[str] = queue.Queue()
        stderr = process.stderr
        assert stderr is not None
        threading.Thread(target=lambda: [lines.put(line) for line in stderr], daemon=True).start()
        serving = "execbox-runner mcp: serving MCP clients on http://127.0.0.1:"
        while not (line := lines.get(timeout=60)).startswith(serving):
            pass
        port = int(line.removeprefix(serving).removesuffix("/mcp\n"))
        assert initialize(port, {"Host": f"127.0.0.1:{port}"}) == 200
    finally:
        stop(process)


def initialize(port: int, headers: dict[str, str]) -> int:
    """The status of an MCP ``initialize`` sent to 127.0.0.1:``port`` with ``headers``."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST",
            "/mcp",
            INITIALIZE,
            {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers},
        )
        return connection.getresponse().status
    finally:
        connection.close()


def test_on_loopback_a_rebound_host_and_a_web_page_are_refused(servers_json: Path, daemon: Daemon) -> None:
    port = free_port()
    with listening(mcp_command(servers_json, daemon, "--port", str(port)), port):
        assert initialize(port, {"Host": f"127.0.0.1:{port}"}) == 200
        assert initialize(port, {"Host": f"localhost:{port}"}) == 200
        assert initialize(port, {"Host": "evil.example"}) == 403
        assert initialize(port, {"Host": f"127.0.0.1:{port}", "Origin": "http://evil.example"}) == 403
        assert initialize(port, {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"}) == 403


def test_off_loopback_the_token_host_and_origin_are_all_checked(servers_json: Path, daemon: Daemon) -> None:
    """The red team's case: on 0.0.0.0 the command served anyone, whatever Host and Origin they named."""
    port = free_port()
    argv = mcp_command(
        servers_json,
        daemon,
        *("--host", "0.0.0.0", "--port", str(port), "--http-token", TOKEN),
        *("--allowed-hosts", f"mcp.example:{port}", "--allowed-origins", "https://app.example"),
    )
    with listening(argv, port):
        good = {"Host": f"mcp.example:{port}", "Authorization": f"Bearer {TOKEN}"}
        assert initialize(port, good) == 200
        assert initialize(port, {**good, "Origin": "https://app.example"}) == 200
        assert initialize(port, {**good, "Host": "evil.example"}) == 403
        assert initialize(port, {**good, "Host": f"127.0.0.1:{port}"}) == 403  # the list replaces the defaults
        assert initialize(port, {**good, "Origin": "http://evil.example"}) == 403
        assert initialize(port, {"Host": f"mcp.example:{port}"}) == 401
        assert initialize(port, {**good, "Authorization": "Bearer wrong"}) == 401


def test_a_token_is_honoured_on_loopback_too(servers_json: Path, daemon: Daemon) -> None:
    port = free_port()
    with listening(mcp_command(servers_json, daemon, "--port", str(port), "--http-token", TOKEN), port):
        assert initialize(port, {"Host": f"127.0.0.1:{port}"}) == 401
        assert initialize(port, {"Host": f"127.0.0.1:{port}", "Authorization": f"Bearer {TOKEN}"}) == 200
