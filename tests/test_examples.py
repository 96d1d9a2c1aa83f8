"""The Python examples run as a user would run them, with what each needs started here."""

from __future__ import annotations

import ast
import json
import os
import queue
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .daemonkit import running_daemon, stop

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_agent_loop_recovers_from_a_rejected_tool_input() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "agent_loop.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "function get_price(input: {" in done.stdout
    assert "turn 1: error validation_error: Invalid input for tool get_price" in done.stdout
    assert 'answer: [{"name": "desk lamp", "price": 42.12}]' in done.stdout


def docstring_lines(example: Path, command: str) -> list[str]:
    """The lines of an example's docstring that run ``command``, as a reader copies them."""
    docstring = ast.get_docstring(ast.parse(example.read_text()), clean=True) or ""
    return [line.strip() for line in docstring.splitlines() if line.strip().startswith(command + " ")]


def run_curl(line: str) -> str:
    """The body a ``curl -s URL [-d BODY]`` line copied from a docstring gets: made as the same
    request (``-d`` posts its body as a form, as curl does), and where curl is installed also by
    running the line as a shell would, which must get the same body."""
    argv = shlex.split(line)
    assert argv[:2] == ["curl", "-s"] and len(argv) in (3, 5) and argv[3:4] in ([], ["-d"]), line
    body = argv[4].encode() if len(argv) == 5 else None
    request = urllib.request.Request(
        "http://" + argv[2], data=body, headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        text: str = response.read().decode()
    if shutil.which("curl") is not None:
        done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60, check=True)
        assert done.stdout == text
    return text


def test_remote_service_against_a_daemon_with_tokens() -> None:
    example = EXAMPLES / "remote_service.py"
    with running_daemon("--tokens", "service-token") as daemon:
        environment = {**os.environ, "EXECBOX_RUNNER_URL": daemon.url, "EXECBOX_RUNNER_TOKEN": "service-token"}
        service = subprocess.Popen(
            [sys.executable, str(example), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=environment,
        )
        try:
            base = first_line(service).removeprefix("remote_service listening on ").strip()
            with urllib.request.urlopen(base + "types", timeout=30) as response:
                assert "function status(input: {\n    order_id: string;\n  }): Promise<{" in response.read().decode()
            code = "const ids = await orders.open_orders(); console.log(ids.length); (await orders.status({order_id: ids[0]})).total"
            assert post(base + "run", {"code": code}) == {"ok": True, "result": 90.0, "error": None, "logs": ["1"]}
            missing = post(base + "run", {"code": "await orders.status({order_id: 'Z-9'})"})
            assert missing["error"] == {"code": "validation_error", "message": "no order Z-9"}
            # The docstring's curl lines, exactly as written but for the port.
            port = base.removeprefix("http://127.0.0.1:").strip("/")
            types, status = (
                line.replace("localhost:8080", f"localhost:{port}") for line in docstring_lines(example, "curl")
            )
            assert run_curl(types).startswith("declare namespace orders {")
            order = {"order_id": "A-1", "status": "shipped", "total": 25.0}
            assert json.loads(run_curl(status)) == {"ok": True, "result": order, "error": None, "logs": []}
        finally:
            stop(service)
            assert service.stdout is not None
            service.stdout.close()


def test_remote_service_reads_the_old_variable_names_with_a_warning() -> None:
    environment = {name: value for name, value in os.environ.items() if not name.startswith("EXECBOX_RUNNER_")}
    service = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "remote_service.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**environment, "EXECBOX_URL": "ws://127.0.0.1:1/"},
    )
    try:
        assert first_line(service).startswith("remote_service listening on ")
    finally:
        stop(service)
        assert service.stdout is not None and service.stderr is not None
        service.stdout.close()
        warning = service.stderr.read()
        service.stderr.close()
    assert warning == "remote_service.py: warning: EXECBOX_URL is deprecated; set EXECBOX_RUNNER_URL instead\n"


def test_remote_service_refuses_a_bad_url_or_a_taken_port_at_start() -> None:
    example = [sys.executable, str(EXAMPLES / "remote_service.py")]
    environment = {name: value for name, value in os.environ.items() if not name.startswith("EXECBOX_")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for extra, message in [
            (["--url", "http://x"], "not a ws:// or wss:// URL: 'http://x' (scheme isn't ws or wss)"),
            (["--url", "ws://127.0.0.1:1/", "--port", str(port)], f"cannot listen on 127.0.0.1:{port}: "),
        ]:
            done = subprocess.run([*example, *extra], capture_output=True, text=True, timeout=60, env=environment)
            assert done.returncode == 2 and done.stdout == ""
            assert done.stderr.startswith(f"remote_service.py: error: {message}") and done.stderr.count("\n") == 1


def test_remote_service_answers_every_bad_request_with_an_http_error() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        nowhere = f"ws://127.0.0.1:{unused.getsockname()[1]}/"  # nothing listens there
    service = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "remote_service.py"), "--port", "0", "--url", nowhere],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        base = first_line(service).removeprefix("remote_service listening on ").strip()
        shape = 'send {"code": "...", "timeoutMs": 5000} (timeoutMs optional)'
        for body, status, error in [
            (b'{"code": "1", "timeoutMs": "x"}', 400, "timeoutMs must be a number of milliseconds above 0 ("),
            (b'{"code": "1", "timeoutMs": 0}', 400, "timeoutMs must be a number of milliseconds above 0 ("),
            (b'{"code": 1}', 400, shape),
            (b"[1]", 400, shape),
            (b"not json", 400, shape),
            (b'{"code": "1"}', 502, f"cannot connect to {nowhere}: connection refused"),
        ]:
            answer = http_error(base + "run", body)
            assert answer[0] == status and answer[1].startswith(error), (body, answer)
        assert http_error(base + "elsewhere", b'{"code": "1"}') == (404, "GET /types or POST /run")
        assert service.poll() is None
    finally:
        stop(service)
        assert service.stdout is not None
        service.stdout.close()


def http_error(url: str, body: bytes) -> tuple[int, str]:
    """The status and JSON error of a request that must fail."""
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=30).close()
    except urllib.error.HTTPError as failed:
        with failed:
            return failed.code, str(json.loads(failed.read())["error"])
    raise AssertionError(f"{url} accepted {body!r}")


def first_line(process: subprocess.Popen[str]) -> str:
    """The process's first stdout line, waited for on a thread so the wait is bounded."""
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    return lines.get(timeout=60)


def post(url: str, value: Any) -> Any:
    request = urllib.request.Request(url, data=json.dumps(value).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())
